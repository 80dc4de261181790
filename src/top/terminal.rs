//! [`Terminal`]: the interactive screen, and [`draw`], one frame onto it.
//!
//! The terminal is put in raw mode, so keys arrive one at a time (`q`
//! quits without Enter, and Ctrl-C arrives as a key rather than a signal),
//! and on the alternate screen, so leaving gives the shell its screen
//! back. Dropping the [`Terminal`] undoes both, on a panic too.

use std::io::{self, Write};

use crossterm::cursor::{Hide, MoveTo, Show};
use crossterm::style::Print;
use crossterm::terminal::{
    Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use crossterm::{execute, queue};

/// Holds stdout in raw mode on the alternate screen until dropped.
#[derive(Debug)]
pub(super) struct Terminal {
    out: io::Stdout,
}

impl Terminal {
    /// Enters raw mode and the alternate screen, cursor hidden.
    pub(super) fn enter() -> io::Result<Terminal> {
        enable_raw_mode()?;
        // From here on, dropping the guard restores whatever was entered.
        let mut t = Terminal { out: io::stdout() };
        execute!(t.out, EnterAlternateScreen, Hide)?;
        Ok(t)
    }

    /// Where frames go.
    pub(super) fn out(&mut self) -> &mut io::Stdout {
        &mut self.out
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // Nothing to do about a failure here: the process is leaving.
        let _ = execute!(self.out, Show, LeaveAlternateScreen);
        let _ = disable_raw_mode();
    }
}

/// Draws `lines` from the top-left corner of a `rows`-high screen in one
/// write: each line is erased and written in place, and the rows below the
/// last are cleared, so a redraw does not blank the screen first (no
/// flicker). Lines must already fit the width.
pub(super) fn draw(out: &mut impl Write, lines: &[String], rows: u16) -> io::Result<()> {
    let mut y: u16 = 0;
    for line in lines.iter().take(usize::from(rows)) {
        queue!(
            out,
            MoveTo(0, y),
            Clear(ClearType::CurrentLine),
            Print(line)
        )?;
        y += 1;
    }
    if y < rows {
        queue!(out, MoveTo(0, y), Clear(ClearType::FromCursorDown))?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_drawn_in_place_line_by_line() {
        let mut out = Vec::new();
        let lines = [
            "fairway top".to_owned(),
            String::new(),
            "alpha 1.0".to_owned(),
        ];
        draw(&mut out, &lines, 10).unwrap();
        let text = String::from_utf8(out).unwrap();
        // Row and column are 1-based on the wire.
        assert_eq!(
            text,
            "\x1b[1;1H\x1b[2Kfairway top\
             \x1b[2;1H\x1b[2K\
             \x1b[3;1H\x1b[2Kalpha 1.0\
             \x1b[4;1H\x1b[J"
        );
        assert!(!text.contains("\x1b[2J"), "never a full clear");
    }

    #[test]
    fn a_frame_never_writes_below_the_last_row() {
        let mut out = Vec::new();
        let lines: Vec<String> = (0..5).map(|i| format!("line {i}")).collect();
        draw(&mut out, &lines, 3).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("line 2") && !text.contains("line 3"),
            "{text}"
        );
        assert!(!text.contains("\x1b[4;1H"), "{text}");
        assert!(!text.contains("\x1b[J"), "nothing below a full screen");
    }
}
