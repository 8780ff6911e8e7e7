//! `strftime_now` for chat templates (Llama 3.1's prints today's date): the subset of
//! Python's `strftime` that templates use, in UTC, on a proleptic Gregorian calendar, with no
//! time-zone database (an appliance has none to trust). The audit trail's dates use the same
//! calendar ([`civil_from_days`]).

/// `strftime_now(format)`: the current UTC date/time, for templates that print today's date
/// (Llama 3.1). Supports `%Y %y %m %d %e %H %M %S %b %B %a %A %j %%`; other specifiers are
/// kept verbatim.
pub(super) fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(secs, &format)
}

fn strftime(secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    let yday = days as i64 - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let s = match spec {
            'Y' => format!("{y}"),
            'y' => format!("{:02}", y.rem_euclid(100)),
            'm' => format!("{m:02}"),
            'd' => format!("{d:02}"),
            'e' => format!("{d:2}"),
            'H' => format!("{:02}", rem / 3600),
            'M' => format!("{:02}", rem / 60 % 60),
            'S' => format!("{:02}", rem % 60),
            'b' => MONTHS[(m - 1) as usize][..3].to_string(),
            'B' => MONTHS[(m - 1) as usize].to_string(),
            'a' => DAYS[(days % 7) as usize][..3].to_string(),
            'A' => DAYS[(days % 7) as usize].to_string(),
            'j' => format!("{yday:03}"),
            '%' => "%".to_string(),
            other => format!("%{other}"),
        };
        out.push_str(&s);
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        assert_eq!(strftime(1_722_085_509 - 86_400, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(1_722_085_509 - 86_400, "%A %j %H:%M:%S %%"),
            "Friday 208 13:05:09 %"
        );
        assert_eq!(strftime(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
    }
}
