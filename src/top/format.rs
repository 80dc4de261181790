//! How numbers read in the view's cells: durations, rates, counts, ratios.

/// A duration in seconds: `40us`, `12ms`, `1.20s`, `250s`; `-` when not a
/// finite non-negative number.
pub(super) fn fmt_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".to_owned();
    }
    let us = (secs * 1e6).round();
    if us < 1000.0 {
        return format!("{us:.0}us");
    }
    let ms = (secs * 1e3).round();
    if ms < 1000.0 {
        return format!("{ms:.0}ms");
    }
    if secs < 100.0 {
        format!("{secs:.2}s")
    } else {
        format!("{secs:.0}s")
    }
}

/// [`fmt_duration`] of a value that may be absent (`-`).
pub(super) fn fmt_opt_duration(secs: Option<f64>) -> String {
    secs.map_or_else(|| "-".to_owned(), fmt_duration)
}

/// A per-second rate: one decimal, two below 0.1, none from 100.
pub(super) fn fmt_rate(r: f64) -> String {
    // -0.0 (a zero delta over a positive span) prints as 0.0.
    let r = r + 0.0;
    if !r.is_finite() || r < 0.0 {
        "-".to_owned()
    } else if r >= 100.0 {
        format!("{r:.0}")
    } else if r > 0.0 && r < 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.1}")
    }
}

/// A gauge that counts things: whole numbers without decimals.
pub(super) fn fmt_count(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        }
        _ => "-".to_owned(),
    }
}

/// A 0..1 ratio as a whole percentage.
pub(super) fn fmt_pct(v: Option<f64>) -> String {
    match v {
        Some(r) if r.is_finite() => format!("{:.0}%", r * 100.0),
        _ => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_rates_read_well() {
        assert_eq!(fmt_duration(0.012), "12ms");
        assert_eq!(fmt_duration(1.2), "1.20s");
        assert_eq!(fmt_duration(0.000_04), "40us");
        assert_eq!(fmt_duration(0.9996), "1.00s");
        assert_eq!(fmt_duration(250.0), "250s");
        assert_eq!(fmt_duration(f64::NAN), "-");
        assert_eq!(fmt_rate(2.0), "2.0");
        assert_eq!(fmt_rate(0.05), "0.05");
        assert_eq!(fmt_rate(0.0), "0.0");
        assert_eq!(fmt_rate(150.4), "150");
    }
}
