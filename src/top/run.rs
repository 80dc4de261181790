//! [`run`]: the loop of `fairway top`, scraping every interval and
//! drawing the view.
//!
//! On a terminal the view is interactive: drawn at once from the first
//! scrape, redrawn in place after each scrape and on every resize, left
//! with `q`, Esc or Ctrl-C (or SIGTERM), the terminal restored on the way
//! out. With `--once`, or when stdout is not a terminal, frames are printed
//! one after the other as plain text.

use std::io::{self, IsTerminal};
use std::time::Duration;

use crossterm::event::{Event, EventStream};
use futures_util::{Stream, StreamExt};

use super::render;
use super::scrape::Scraper;
use super::terminal::{Terminal, draw};
use super::view::{Step, View};
use crate::net::scrape::ScrapeError;

/// Width of printed frames when `COLUMNS` is unset and stdout is not a
/// terminal.
const DEFAULT_WIDTH: usize = 140;

/// Why `fairway top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// A scrape failed; the view stops rather than show stale figures.
    #[error(transparent)]
    Scrape(#[from] ScrapeError),
    /// The terminal could not be set up, read or written.
    #[error("the terminal")]
    Terminal(#[from] io::Error),
}

/// Scrapes `http://{admin}/metrics` every `interval` and shows the view:
/// interactive on a terminal, else printed. With `once`, prints one frame
/// (rates over one interval) and returns.
pub async fn run(admin: &str, interval: Duration, once: bool) -> Result<(), TopError> {
    let scraper = Scraper::new(admin)?;
    if once || !io::stdout().is_terminal() {
        return print_frames(&scraper, interval, once).await;
    }
    // Scrape before taking the terminal: a wrong address is reported on
    // the ordinary screen.
    let first = scraper.scrape().await?;
    let size = crossterm::terminal::size()?;
    let mut term = Terminal::enter()?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let scrape = async || scraper.scrape().await;
    tokio::select! {
        r = interactive(scrape, first, interval, EventStream::new(), term.out(), size) => r,
        _ = sigterm.recv() => Ok(()),
    }
    // `term` drops here, after the loop: the screen comes back before any
    // error is printed.
}

/// The plain loop: a frame per interval, the screen cleared before each
/// when stdout is a terminal. Width: `COLUMNS`, else the terminal's, else
/// [`DEFAULT_WIDTH`].
async fn print_frames(scraper: &Scraper, interval: Duration, once: bool) -> Result<(), TopError> {
    let tty = io::stdout().is_terminal();
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .or_else(|| {
            tty.then(crossterm::terminal::size)
                .and_then(Result::ok)
                .map(|(cols, _)| usize::from(cols))
        })
        .unwrap_or(DEFAULT_WIDTH);
    let mut prev = scraper.scrape().await?;
    loop {
        tokio::time::sleep(interval).await;
        let cur = scraper.scrape().await?;
        let frame = render(Some(&prev), &cur, width);
        if once {
            print!("{frame}");
            return Ok(());
        }
        if tty {
            print!("\x1b[2J\x1b[H");
        }
        println!("{frame}");
        prev = cur;
    }
}

/// The interactive loop on a `size` (columns, rows) terminal: draws
/// `first` at once, then scrapes every `interval` and handles `events`
/// meanwhile, a scrape in flight included. Ends `Ok` on a quit key or when
/// the events end.
async fn interactive<S, E, W>(
    scrape: S,
    first: super::Snapshot,
    interval: Duration,
    mut events: E,
    out: &mut W,
    size: (u16, u16),
) -> Result<(), TopError>
where
    S: AsyncFn() -> Result<super::Snapshot, ScrapeError>,
    E: Stream<Item = io::Result<Event>> + Unpin,
    W: io::Write,
{
    let mut view = View::new(first, size);
    draw(out, &view.lines(), view.rows())?;
    let mut next = std::pin::pin!(after(interval, &scrape));
    loop {
        tokio::select! {
            snap = &mut next => {
                view.push(snap?);
                draw(out, &view.lines(), view.rows())?;
                next.set(after(interval, &scrape));
            }
            ev = events.next() => {
                let Some(ev) = ev else {
                    return Ok(());
                };
                match view.on_event(&ev?) {
                    Step::Quit => return Ok(()),
                    Step::Redraw => draw(out, &view.lines(), view.rows())?,
                    Step::Ignore => {}
                }
            }
        }
    }
}

/// `scrape()` once `interval` has passed.
async fn after<S, T>(interval: Duration, scrape: &S) -> T
where
    S: AsyncFn() -> T,
{
    tokio::time::sleep(interval).await;
    scrape().await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use futures_util::stream;

    use super::super::Snapshot;
    use super::super::fixtures::{alpha_after, alpha_before, body};
    use super::*;

    fn key(c: char) -> io::Result<Event> {
        Ok(Event::Key(KeyEvent::new(
            KeyCode::Char(c),
            KeyModifiers::NONE,
        )))
    }

    fn first() -> Snapshot {
        Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap()
    }

    /// The frames drawn: each starts at the top-left corner.
    fn frames(out: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(out)
            .split("\x1b[1;1H")
            .skip(1)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_resize_redraws_and_a_quit_key_ends_the_loop() {
        let scrapes = Cell::new(0);
        let scrape = async || {
            scrapes.set(scrapes.get() + 1);
            Ok(first())
        };
        let mut events = stream::iter([Ok(Event::Resize(60, 8)), key('x'), key('q'), key('z')]);
        let mut out = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let hour = Duration::from_secs(3600);
        rt.block_on(interactive(
            scrape,
            first(),
            hour,
            &mut events,
            &mut out,
            (200, 50),
        ))
        .unwrap();

        let frames = frames(&out);
        assert_eq!(frames.len(), 2, "the first frame and the resize's");
        assert!(frames[0].contains("(rates from the next scrape)"));
        assert!(!frames[0].contains("more columns"), "{:?}", frames[0]);
        assert!(frames[1].contains("more columns"), "{:?}", frames[1]);
        assert!(frames[1].contains("more lines"), "{:?}", frames[1]);
        assert!(!frames[1].contains("\x1b[9;1H"), "8 rows: nothing on row 9");
        assert_eq!(scrapes.get(), 0);
        // `q` ended the loop: the key after it was never read.
        let rest = rt.block_on(events.next());
        assert!(matches!(rest, Some(Ok(Event::Key(k))) if k.code == KeyCode::Char('z')));
    }

    #[tokio::test]
    async fn each_scrape_redraws_with_rates_until_the_events_end() {
        let scrapes = Cell::new(0);
        let scrape = async || {
            scrapes.set(scrapes.get() + 1);
            Ok(Snapshot::from_text(&body(&alpha_after()), 12.0).unwrap())
        };
        // A key that is not a quit key, then the input closes.
        let events = Box::pin(stream::once(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            key('x')
        }));
        let mut out = Vec::new();
        let every = Duration::from_millis(5);
        interactive(scrape, first(), every, events, &mut out, (200, 50))
            .await
            .unwrap();

        assert!(scrapes.get() >= 1);
        let frames = frames(&out);
        assert_eq!(frames.len(), 1 + scrapes.get(), "one frame per scrape");
        assert!(frames[1].contains("window 2.00s"), "{:?}", frames[1]);
        assert!(frames[1].contains("12.5"), "alpha's req/s: {:?}", frames[1]);
    }

    #[tokio::test]
    async fn a_failed_scrape_or_terminal_ends_the_loop_with_the_error() {
        let scrape = async || {
            Err(ScrapeError::unusable(
                "http://x/metrics",
                "no fairway_ metrics",
            ))
        };
        let mut out = Vec::new();
        let every = Duration::from_millis(1);
        let r = interactive(
            scrape,
            first(),
            every,
            stream::pending(),
            &mut out,
            (80, 24),
        )
        .await;
        assert!(matches!(r, Err(TopError::Scrape(_))), "{r:?}");

        let scrape = async || Ok(first());
        let gone = stream::iter([Err(io::Error::other("gone"))]);
        let hour = Duration::from_secs(3600);
        let r = interactive(scrape, first(), hour, gone, &mut out, (80, 24)).await;
        assert!(matches!(r, Err(TopError::Terminal(_))), "{r:?}");
    }
}
