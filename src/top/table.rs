//! A plain-text table that fits a width by dropping whole columns.

use std::fmt::Write as _;

/// Writes a table: a header row, then `rows`, columns padded to their
/// widest cell (left-aligned where `left` says so, else right-aligned).
/// Columns that do not fit in `width` are dropped whole, from the right,
/// and named in a note; the first column is always shown.
pub(super) fn write_table(
    out: &mut String,
    headers: &[&str],
    left: &[bool],
    rows: &[Vec<String>],
    width: usize,
) {
    let n = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let wide = widths.iter().sum::<usize>() + 2 * n.saturating_sub(1);
    let gap = if wide <= width { 2 } else { 1 };
    let mut shown = 0;
    let mut used = 0;
    for (i, w) in widths.iter().enumerate() {
        let need = if i == 0 { *w } else { used + gap + *w };
        if i > 0 && need > width {
            break;
        }
        used = need;
        shown = i + 1;
    }
    let header_cells: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for cells in std::iter::once(&header_cells).chain(rows) {
        let mut line = String::new();
        for (i, w) in widths.iter().enumerate().take(shown) {
            let w = *w;
            let cell = cells.get(i).map_or("", String::as_str);
            if i > 0 {
                line.push_str(&" ".repeat(gap));
            }
            if left.get(i).copied().unwrap_or(false) {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "{cell:>w$}");
            }
        }
        push_line(out, line.trim_end(), width);
    }
    if shown < n {
        let hidden: Vec<&str> = headers.iter().skip(shown).copied().collect();
        let s = if n - shown == 1 { "" } else { "s" };
        let note = format!("({} more column{s}: {})", n - shown, hidden.join(", "));
        push_line(out, &note, width);
    }
}

/// Appends `line`, cut to `width` characters, and a newline.
pub(super) fn push_line(out: &mut String, line: &str, width: usize) {
    if line.chars().count() > width {
        out.extend(line.chars().take(width));
    } else {
        out.push_str(line);
    }
    out.push('\n');
}
