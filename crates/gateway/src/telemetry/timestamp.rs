//! A log line's timestamp, as `tracing-subscriber`'s `SystemTime` writes it
//! (`2026-12-07T01:52:33.123456Z`, UTC, microseconds), with the date and time of day made once
//! per second on each thread: every line of a busy second shares them, and only its
//! microseconds are new.

use std::cell::RefCell;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

thread_local! {
    /// The second last written on this thread, and its text up to the seconds.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Writes the current time.
pub(super) fn write_now(out: &mut dyn fmt::Write) -> fmt::Result {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => write(since, out),
        // A clock before 1970: as the formatter it stands in for would write it.
        Err(_) => {
            use tracing_subscriber::fmt::time::FormatTime;
            let mut out = out;
            tracing_subscriber::fmt::time::SystemTime
                .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut out))
        }
    }
}

/// Writes the time `since` the epoch.
fn write(since: Duration, out: &mut dyn fmt::Write) -> fmt::Result {
    let secs = since.as_secs();
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            cached.1.clear();
            date_and_time(secs, &mut cached.1)?;
            cached.0 = secs;
        }
        out.write_str(&cached.1)
    })?;
    let mut tail = *b".000000Z";
    let mut micros = since.subsec_micros();
    for digit in tail[1..7].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    out.write_str(std::str::from_utf8(&tail).expect("ASCII digits"))
}

/// `YYYY-MM-DDTHH:MM:SS` of `secs` after the epoch (proleptic Gregorian calendar, UTC).
fn date_and_time(secs: u64, out: &mut String) -> fmt::Result {
    use fmt::Write as _;
    let days = secs / 86_400;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    if year > 9999 {
        write!(out, "+{year}")?;
    } else {
        write!(out, "{year:04}")?;
    }
    write!(
        out,
        "-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The calendar date of a day count since 1970-01-01: the era-based conversion (400-year eras
/// of 146,097 days, years counted from March so the leap day ends the year).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(since: Duration) -> String {
        let mut s = String::new();
        write(since, &mut s).unwrap();
        s
    }

    #[test]
    fn known_instants_are_written_as_rfc3339_with_microseconds() {
        for (secs, micros, want) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 7, "2000-02-29T00:00:00.000007Z"),
            (951_868_799, 999_999, "2000-02-29T23:59:59.999999Z"),
            (1_709_164_800, 120_000, "2024-02-29T00:00:00.120000Z"),
            (4_107_542_399, 1, "2100-02-28T23:59:59.000001Z"),
            (4_107_542_400, 0, "2100-03-01T00:00:00.000000Z"),
            (253_402_300_799, 0, "9999-12-31T23:59:59.000000Z"),
        ] {
            let since = Duration::from_secs(secs) + Duration::from_micros(micros);
            assert_eq!(text(since), want, "{secs} s {micros} µs");
            // Written again in the same second: the kept part is reused, the rest is new.
            assert_eq!(
                text(since + Duration::from_nanos(500)),
                want,
                "{secs} s again"
            );
        }
    }

    #[test]
    fn every_day_of_four_centuries_matches_the_formatter_it_stands_in_for() {
        // tracing-subscriber writes only the current time; compare with it now, and check the
        // calendar day by day against a plain count of days per month.
        let mut theirs = String::new();
        let mut mine = String::new();
        for _ in 0..3 {
            theirs.clear();
            mine.clear();
            {
                use tracing_subscriber::fmt::time::FormatTime;
                tracing_subscriber::fmt::time::SystemTime
                    .format_time(&mut tracing_subscriber::fmt::format::Writer::new(
                        &mut theirs,
                    ))
                    .unwrap();
            }
            write_now(&mut mine).unwrap();
            if theirs[..19] == mine[..19] {
                break;
            }
        }
        assert_eq!(theirs[..19], mine[..19], "{theirs} against {mine}");
        assert_eq!(theirs.len(), mine.len());

        let leap =
            |y: u64| y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400));
        let (mut y, mut m, mut d) = (1970u64, 1u64, 1u64);
        for days in 0..146_097 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let in_month = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > in_month {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
