//! When and how long to wait before retrying a model request.
//!
//! Owns the retry policy (bounded attempts, exponential backoff with jitter) and the parsing of
//! the servers' own hints: `retry-after-ms` (milliseconds, used by OpenAI and Anthropic) and
//! `retry-after` (delay in seconds, or an HTTP date in any of the three formats of RFC 9110
//! §5.6.7). It does not decide WHICH failures are retryable; the transport does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderMap;

/// How often and how patiently a provider retries a request that failed before any output.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Total attempts including the first one; at least 1.
    pub max_attempts: u32,
    /// Backoff before the first retry; doubled for each further retry.
    pub initial_backoff: Duration,
    /// Upper bound of the computed backoff (before jitter).
    pub max_backoff: Duration,
    /// Longest server-requested wait (`retry-after`) Cordon honours. A server asking for more
    /// fails the request at once with an error naming the wait, rather than hanging the run.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// A policy with `max_attempts` attempts and the given initial backoff; other fields default.
    pub fn new(max_attempts: u32, initial_backoff: Duration) -> Self {
        RetryPolicy {
            max_attempts,
            initial_backoff,
            ..RetryPolicy::default()
        }
    }

    /// A policy that never retries.
    pub fn none() -> Self {
        RetryPolicy::new(1, Duration::ZERO)
    }

    /// The wait before retry number `retry` (1 for the first retry), given a `jitter` sample
    /// in `[0, 1)`: `min(initial * 2^(retry-1), max)` scaled into `[50 %, 100 %]` of itself,
    /// so that clients failing together do not retry together.
    pub fn backoff(&self, retry: u32, jitter: f64) -> Duration {
        let exponent = retry.saturating_sub(1).min(30);
        let base = self
            .initial_backoff
            .saturating_mul(1u32 << exponent)
            .min(self.max_backoff);
        base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

/// The delay a response asks for: `retry-after-ms` wins over `retry-after`; an HTTP date in the
/// past means "now". `None` when neither header is present or parseable.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parse an HTTP date: IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850
/// form (`Sunday, 06-Nov-94 08:49:37 GMT`) or asctime (`Sun Nov  6 08:49:37 1994`).
pub fn parse_http_date(value: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = value.split_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        [_weekday, day, month, year, time, "GMT"] => (*day, *month, *year, *time),
        [_weekday, date, time, "GMT"] => {
            let mut fields = date.split('-');
            let (day, month, year) = (fields.next()?, fields.next()?, fields.next()?);
            if fields.next().is_some() {
                return None;
            }
            (day, month, year, *time)
        }
        [_weekday, month, day, time, year] => (*day, *month, *year, *time),
        _ => return None,
    };
    let day: u32 = day.parse().ok()?;
    let month = match month {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let mut year: i64 = year.parse().ok()?;
    if year < 100 {
        // RFC 9110: a two-digit year more than 50 years in the future is in the past century.
        year += if year < 70 { 2000 } else { 1900 };
    }
    let mut clock = time.split(':').map(|v| v.parse::<u64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if clock.next().is_some() || hour > 23 || minute > 59 || second > 60 || day == 0 || day > 31 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + (hour * 3600 + minute * 60 + second) as i64;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn backoff_doubles_caps_and_jitters_down_to_half() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(60),
        };
        assert_eq!(policy.backoff(1, 1.0), Duration::from_millis(100));
        assert_eq!(policy.backoff(2, 1.0), Duration::from_millis(200));
        assert_eq!(policy.backoff(3, 1.0), Duration::from_millis(400));
        assert_eq!(policy.backoff(5, 1.0), Duration::from_millis(1000));
        assert_eq!(policy.backoff(40, 1.0), Duration::from_millis(1000));
        assert_eq!(policy.backoff(2, 0.0), Duration::from_millis(100));
        assert_eq!(policy.backoff(2, 0.5), Duration::from_millis(150));
    }

    #[test]
    fn retry_after_ms_wins_over_seconds() {
        let now = SystemTime::now();
        let h = headers(&[("retry-after-ms", "1500"), ("retry-after", "9")]);
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(1500)));
        let h = headers(&[("retry-after", "7")]);
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        let h = headers(&[("retry-after", "0.25")]);
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "-3")]), now), None);
    }

    #[test]
    fn retry_after_http_date_counts_from_now() {
        let now = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT")]);
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        let past = headers(&[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")]);
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
    }

    #[test]
    fn parses_all_three_http_date_formats() {
        let expected = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(expected)
        );
        assert_eq!(
            parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(expected)
        );
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), Some(expected));
        assert_eq!(
            parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(UNIX_EPOCH)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 12:00:00 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(1_835_438_400))
        );
        assert_eq!(parse_http_date("Sun, 06 Foo 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 25:49:37 GMT"), None);
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
