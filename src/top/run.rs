//! [`run`]: the loop of `fairway top`, scraping every interval and
//! printing the view.

use std::io::IsTerminal;
use std::time::Duration;

use super::render;
use super::scrape::{ScrapeError, Scraper};

/// Width used when `COLUMNS` is unset.
const DEFAULT_WIDTH: usize = 140;

/// Why `fairway top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// A scrape failed; the view stops rather than show stale figures.
    #[error(transparent)]
    Scrape(#[from] ScrapeError),
}

/// Scrapes `http://{admin}/metrics` every `interval` and prints the view,
/// clearing the screen first when stdout is a terminal. With `once`, prints
/// one frame (rates over one interval) and returns.
pub async fn run(admin: &str, interval: Duration, once: bool) -> Result<(), TopError> {
    let scraper = Scraper::new(admin)?;
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(DEFAULT_WIDTH);
    let tty = std::io::stdout().is_terminal();
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
