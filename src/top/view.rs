//! [`View`]: what the interactive screen shows (the last two snapshots,
//! rendered at the terminal's size) and what a key or a resize does to it.

use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};

use super::{Snapshot, render};

/// What an event asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// `q`, `Q`, Esc or Ctrl-C: leave.
    Quit,
    /// The terminal changed size: draw again at the new size.
    Redraw,
    /// Anything else.
    Ignore,
}

/// The last two snapshots and the terminal's size.
#[derive(Debug)]
pub(super) struct View {
    prev: Option<Snapshot>,
    cur: Snapshot,
    cols: u16,
    rows: u16,
}

impl View {
    /// A view of one snapshot (rates from the next) on a `(cols, rows)`
    /// terminal.
    pub(super) fn new(first: Snapshot, (cols, rows): (u16, u16)) -> View {
        View {
            prev: None,
            cur: first,
            cols,
            rows,
        }
    }

    /// Takes a new scrape; the current one becomes the base of its rates.
    pub(super) fn push(&mut self, next: Snapshot) {
        self.prev = Some(std::mem::replace(&mut self.cur, next));
    }

    /// Handles one terminal event; a resize takes effect at once.
    pub(super) fn on_event(&mut self, ev: &Event) -> Step {
        match ev {
            Event::Key(k) if k.kind == KeyEventKind::Press => match k.code {
                KeyCode::Char('q' | 'Q') | KeyCode::Esc => Step::Quit,
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Step::Quit,
                _ => Step::Ignore,
            },
            Event::Resize(cols, rows) => {
                self.cols = *cols;
                self.rows = *rows;
                Step::Redraw
            }
            _ => Step::Ignore,
        }
    }

    /// The terminal's height.
    pub(super) fn rows(&self) -> u16 {
        self.rows
    }

    /// The screen's lines: the view rendered at the terminal's width, cut
    /// to its height.
    pub(super) fn lines(&self) -> Vec<String> {
        // render reads a width of 0 as "no limit".
        let cols = usize::from(self.cols.max(1));
        let text = render(self.prev.as_ref(), &self.cur, cols);
        fit_rows(&text, usize::from(self.rows), cols)
    }
}

/// At most `rows` lines of `text`. When some do not fit, the last one shown
/// says how many are left out (cut to `cols` characters).
fn fit_rows(text: &str, rows: usize, cols: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= rows {
        return lines.into_iter().map(str::to_owned).collect();
    }
    let Some(keep) = rows.checked_sub(1) else {
        return Vec::new();
    };
    let more = lines.len() - keep;
    let s = if more == 1 { "" } else { "s" };
    let note: String = format!("({more} more line{s}; a taller terminal shows them)")
        .chars()
        .take(cols)
        .collect();
    lines[..keep]
        .iter()
        .map(|l| (*l).to_owned())
        .chain(std::iter::once(note))
        .collect()
}

#[cfg(test)]
mod tests {
    use crossterm::event::{KeyEvent, MouseEvent, MouseEventKind};

    use super::super::fixtures::{alpha_after, alpha_before, body, row};
    use super::*;

    fn key(code: KeyCode, modifiers: KeyModifiers) -> Event {
        Event::Key(KeyEvent::new(code, modifiers))
    }

    fn view(size: (u16, u16)) -> View {
        let first = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        View::new(first, size)
    }

    #[test]
    fn q_esc_and_ctrl_c_quit_other_keys_do_not() {
        let mut v = view((200, 50));
        for quit in [
            key(KeyCode::Char('q'), KeyModifiers::NONE),
            key(KeyCode::Char('Q'), KeyModifiers::SHIFT),
            key(KeyCode::Esc, KeyModifiers::NONE),
            key(KeyCode::Char('c'), KeyModifiers::CONTROL),
        ] {
            assert_eq!(v.on_event(&quit), Step::Quit, "{quit:?}");
        }
        let release = Event::Key(KeyEvent {
            kind: KeyEventKind::Release,
            ..KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE)
        });
        for other in [
            key(KeyCode::Char('c'), KeyModifiers::NONE),
            key(KeyCode::Char('x'), KeyModifiers::NONE),
            key(KeyCode::Enter, KeyModifiers::NONE),
            release,
            Event::FocusGained,
            Event::Mouse(MouseEvent {
                kind: MouseEventKind::Moved,
                column: 1,
                row: 1,
                modifiers: KeyModifiers::NONE,
            }),
        ] {
            assert_eq!(v.on_event(&other), Step::Ignore, "{other:?}");
        }
    }

    #[test]
    fn a_resize_redraws_at_the_new_width_and_height() {
        let mut v = view((200, 50));
        v.push(Snapshot::from_text(&body(&alpha_after()), 12.0).unwrap());
        let wide = v.lines();
        assert!(wide.iter().all(|l| !l.contains("more columns")), "{wide:?}");
        assert_eq!(row(&wide.join("\n"), "alpha")[1], "12.5");

        assert_eq!(v.on_event(&Event::Resize(60, 8)), Step::Redraw);
        let narrow = v.lines();
        assert_eq!(narrow.len(), 8, "{narrow:?}");
        assert!(narrow.iter().all(|l| l.chars().count() <= 60), "{narrow:?}");
        assert!(narrow.iter().any(|l| l.contains("more columns")));
        assert!(narrow[7].starts_with('(') && narrow[7].contains("more lines"));
        // The columns still shown are whole.
        assert_eq!(row(&narrow.join("\n"), "alpha")[1], "12.5");

        assert_eq!(v.on_event(&Event::Resize(200, 50)), Step::Redraw);
        assert_eq!(v.lines(), wide);
    }

    #[test]
    fn the_first_frame_needs_no_second_scrape() {
        let v = view((200, 50));
        let text = v.lines().join("\n");
        assert!(text.contains("(rates from the next scrape)"), "{text}");
        assert_eq!(row(&text, "alpha")[1], "-");
    }

    #[test]
    fn rows_that_do_not_fit_are_counted() {
        let text = "a\nb\nc\nd\n";
        assert_eq!(fit_rows(text, 4, 80), ["a", "b", "c", "d"]);
        assert_eq!(fit_rows(text, 9, 80), ["a", "b", "c", "d"]);
        assert_eq!(
            fit_rows(text, 3, 80),
            ["a", "b", "(2 more lines; a taller terminal shows them)"]
        );
        assert_eq!(
            fit_rows(text, 1, 10),
            ["(4 more li"],
            "the note is cut to the width"
        );
        assert!(fit_rows(text, 0, 80).is_empty());
        // A zero-sized terminal draws nothing rather than panic.
        assert!(view((0, 0)).lines().is_empty());
    }
}
