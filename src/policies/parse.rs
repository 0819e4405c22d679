//! Configurations from strings: `"100/min"`, `"10r/s burst=20 nodelay"`, and (with the `serde`
//! feature) from any format serde reads, as the same strings.
//!
//! The grammar, one rate and then options separated by spaces:
//!
//! ```text
//! rate    = [ "rate=" ] count [ "r" ] "/" [ number ] unit     "100/min", "10r/s", "5/10s"
//! unit    = ns | us | µs | ms | s | sec | second | seconds | m | min | minute | minutes
//!         | h | hr | hour | hours | d | day | days
//! options = token bucket: burst=N  initial=N
//!           queued:       burst=N  initial=N  queue=N | queue=<number><unit>   (queue required)
//!           nginx:        burst=N  nodelay  delay=N    (rates in r/s or r/m only, as nginx)
//!           windows:      none ("100/min" is 100 per window of a minute)
//! ```
//!
//! A token bucket without `burst=` has a burst of its count (`"100/min"`: 100 at once, then 100
//! a minute), as [`TokenBucket::per_minute`] does. Every refusal is a [`ParseError`] naming the
//! part of the input that was wrong; values that parse but do not make a limit (a zero rate, a
//! burst too large) are [`ParseError::Invalid`] with the [`ConfigError`] that construction gave.

use core::fmt;
use core::str::FromStr;
use core::time::Duration;

use crate::{ConfigError, FixedWindow, Nginx, Queued, Rate, SlidingLog, SlidingWindow, TokenBucket};

/// Why a configuration string could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// The string is empty (or only spaces).
    Empty,
    /// The rate is not `count/period` (`"100/min"`, `"10r/s"`, `"5/10s"`).
    BadRate {
        /// The rate as given.
        rate: String,
    },
    /// A number that is not a whole number in range.
    BadNumber {
        /// What the number configures: `"count"`, `"period"`, `"burst"`, ...
        what: &'static str,
        /// The number as given.
        number: String,
    },
    /// A time unit this grammar does not know.
    UnknownUnit {
        /// The unit as given.
        unit: String,
    },
    /// nginx rates are per second or per minute only (`r/s`, `r/m`).
    NginxUnit {
        /// The period as given.
        period: String,
    },
    /// An option the algorithm does not take.
    UnknownOption {
        /// The option as given.
        option: String,
        /// The algorithm.
        algorithm: &'static str,
    },
    /// An option the algorithm needs, missing.
    MissingOption {
        /// The option's name.
        option: &'static str,
        /// The algorithm.
        algorithm: &'static str,
    },
    /// An option given twice.
    DuplicateOption {
        /// The option's name.
        option: String,
    },
    /// The string reads, but its values do not make a limit.
    Invalid(ConfigError),
    /// A meter's rate or size without a unit this grammar knows (or a bit rate that is not a
    /// whole number of bytes per second).
    BadMeterUnit {
        /// What the value configures: `"cir"`, `"cbs"`, ...
        what: &'static str,
        /// The value as given.
        value: String,
    },
    /// A meter this grammar does not know (`srtcm`, `trtcm` and `rfc4115` are).
    UnknownMeter {
        /// The name as given.
        meter: String,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => f.write_str("an empty limit: expected a rate such as `100/min`"),
            ParseError::BadRate { rate } => write!(
                f,
                "`{rate}` is not a rate: expected `count/period`, such as `100/min`, `10r/s` or `5/10s`"
            ),
            ParseError::BadNumber { what, number } => {
                write!(f, "the {what} `{number}` is not a whole number in range")
            }
            ParseError::UnknownUnit { unit } => write!(
                f,
                "unknown time unit `{unit}`: expected ns, us, ms, s, min, h or d (or their long names)"
            ),
            ParseError::NginxUnit { period } => {
                write!(f, "nginx rates are per second or per minute (`r/s`, `r/m`), not per `{period}`")
            }
            ParseError::UnknownOption { option, algorithm } => {
                write!(f, "unknown option `{option}` for a {algorithm}")
            }
            ParseError::MissingOption { option, algorithm } => {
                write!(f, "a {algorithm} needs the option `{option}=`")
            }
            ParseError::DuplicateOption { option } => write!(f, "the option `{option}` is given twice"),
            ParseError::Invalid(e) => write!(f, "invalid limit: {e}"),
            ParseError::BadMeterUnit { what, value } => write!(
                f,
                "the {what} `{value}` is not a whole number with a unit: rates as `100Mbit/s` or `12500000B/s` \
                 (bit rates in whole bytes per second), sizes as `16KiB` or `2048`"
            ),
            ParseError::UnknownMeter { meter } => {
                write!(f, "unknown meter `{meter}`: expected srtcm, trtcm or rfc4115")
            }
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for ParseError {
    fn from(e: ConfigError) -> ParseError {
        ParseError::Invalid(e)
    }
}

/// A rate as read: `count` per `amount · unit`.
struct Spec<'a> {
    count: u64,
    period: Duration,
    /// The period as written, for messages.
    period_text: &'a str,
    options: Options<'a>,
}

/// `name=value` and flag options, each at most once.
struct Options<'a>(Vec<(&'a str, Option<&'a str>)>);

impl<'a> Options<'a> {
    /// Takes the option `name`'s value (`Some(None)` for a flag).
    fn take(&mut self, name: &str) -> Option<Option<&'a str>> {
        let i = self.0.iter().position(|(n, _)| *n == name)?;
        Some(self.0.remove(i).1)
    }

    /// Takes `name=N`.
    fn number(&mut self, name: &'static str) -> Result<Option<u64>, ParseError> {
        match self.take(name) {
            None => Ok(None),
            Some(None) => Err(ParseError::BadNumber { what: name, number: String::new() }),
            Some(Some(v)) => number(name, v).map(Some),
        }
    }

    /// Fails on any option not taken.
    fn done(self, algorithm: &'static str) -> Result<(), ParseError> {
        match self.0.first() {
            None => Ok(()),
            Some((name, value)) => Err(ParseError::UnknownOption {
                option: match value {
                    Some(v) => format!("{name}={v}"),
                    None => (*name).to_owned(),
                },
                algorithm,
            }),
        }
    }
}

fn number(what: &'static str, s: &str) -> Result<u64, ParseError> {
    // `u64::from_str` takes a leading `+`; a configuration should not.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::BadNumber { what, number: s.to_owned() });
    }
    s.parse().map_err(|_| ParseError::BadNumber { what, number: s.to_owned() })
}

/// A unit's length in nanoseconds.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "second" | "seconds" => 1_000_000_000,
        "m" | "min" | "minute" | "minutes" => 60_000_000_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000_000_000,
        "d" | "day" | "days" => 86_400_000_000_000,
        _ => return None,
    })
}

fn spec(input: &str) -> Result<Spec<'_>, ParseError> {
    let mut parts = input.split_whitespace();
    let rate = parts.next().ok_or(ParseError::Empty)?;
    let rate_body = rate.strip_prefix("rate=").unwrap_or(rate);
    let (count, period) =
        rate_body.split_once('/').ok_or_else(|| ParseError::BadRate { rate: rate.to_owned() })?;
    let count = number("count", count.strip_suffix('r').unwrap_or(count))?;
    let digits = period.bytes().take_while(u8::is_ascii_digit).count();
    let (amount, unit) = period.split_at(digits);
    let amount = if amount.is_empty() { 1 } else { number("period", amount)? };
    let nanos = unit_nanos(unit).ok_or_else(|| {
        if unit.is_empty() {
            ParseError::BadRate { rate: rate.to_owned() }
        } else {
            ParseError::UnknownUnit { unit: unit.to_owned() }
        }
    })?;
    let nanos = amount
        .checked_mul(nanos)
        .ok_or_else(|| ParseError::BadNumber { what: "period", number: period.to_owned() })?;
    let mut options = Options(Vec::new());
    for part in parts {
        let (name, value) = match part.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (part, None),
        };
        if options.0.iter().any(|(n, _)| *n == name) {
            return Err(ParseError::DuplicateOption { option: name.to_owned() });
        }
        options.0.push((name, value));
    }
    Ok(Spec { count, period: Duration::from_nanos(nanos), period_text: period, options })
}

/// `"100/min"`, `"10/s burst=20"`, `"1/200ms burst=5 initial=0"`.
impl FromStr for TokenBucket {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<TokenBucket, ParseError> {
        let mut spec = spec(s)?;
        let quota = bucket(&mut spec)?;
        spec.options.done("token bucket")?;
        Ok(quota)
    }
}

/// The token bucket of `spec`, taking its options.
fn bucket(spec: &mut Spec<'_>) -> Result<TokenBucket, ParseError> {
    let burst = spec.options.number("burst")?;
    let initial = spec.options.number("initial")?;
    let quota = TokenBucket::new(Rate::per(spec.count, spec.period), burst.unwrap_or(spec.count))?;
    Ok(match initial {
        Some(i) => quota.with_initial(i)?,
        None => quota,
    })
}

/// A token bucket and its line: `"10/s burst=1 queue=20"` (at most 20 tokens waiting),
/// `"100/s queue=500ms"` (at most half a second of waiting).
impl FromStr for Queued {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Queued, ParseError> {
        const NAME: &str = "queued token bucket";
        let mut spec = spec(s)?;
        let quota = bucket(&mut spec)?;
        let queue = match spec.options.take("queue") {
            None => return Err(ParseError::MissingOption { option: "queue", algorithm: NAME }),
            Some(None) => return Err(ParseError::BadNumber { what: "queue", number: String::new() }),
            Some(Some(v)) => v,
        };
        spec.options.done(NAME)?;
        let digits = queue.bytes().take_while(u8::is_ascii_digit).count();
        let (amount, unit) = queue.split_at(digits);
        let amount = number("queue", amount)?;
        if unit.is_empty() {
            return Ok(Queued::with_max_queued(quota, amount)?);
        }
        let nanos = unit_nanos(unit).ok_or_else(|| ParseError::UnknownUnit { unit: unit.to_owned() })?;
        let nanos = amount
            .checked_mul(nanos)
            .ok_or_else(|| ParseError::BadNumber { what: "queue", number: queue.to_owned() })?;
        Ok(Queued::new(quota, Duration::from_nanos(nanos))?)
    }
}

/// nginx's own words: `"10r/s burst=20 nodelay"`, `"rate=30r/m burst=5 delay=2"`.
impl FromStr for Nginx {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Nginx, ParseError> {
        let mut spec = spec(s)?;
        let quota = match spec.period.as_secs() {
            _ if spec.period.subsec_nanos() != 0 => None,
            1 => Some(Nginx::per_second(spec.count)?),
            60 => Some(Nginx::per_minute(spec.count)?),
            _ => None,
        };
        let quota = quota.ok_or_else(|| ParseError::NginxUnit { period: spec.period_text.to_owned() })?;
        let quota = match spec.options.number("burst")? {
            Some(b) => quota.burst(b)?,
            None => quota,
        };
        let nodelay = spec.options.take("nodelay");
        if let Some(Some(v)) = nodelay {
            return Err(ParseError::UnknownOption {
                option: format!("nodelay={v}"),
                algorithm: "nginx limit",
            });
        }
        let delay = spec.options.number("delay")?;
        spec.options.done("nginx limit")?;
        Ok(match (nodelay, delay) {
            (Some(_), Some(_)) => {
                return Err(ParseError::UnknownOption {
                    option: "delay with nodelay".to_owned(),
                    algorithm: "nginx limit",
                })
            }
            (Some(_), None) => quota.nodelay(),
            (None, Some(d)) => quota.delay(d),
            (None, None) => quota,
        })
    }
}

macro_rules! window_from_str {
    ($($ty:ident: $name:literal),*) => {$(
        /// `"100/min"`: a limit of 100 per window of one minute; `"10/5s"`.
        impl FromStr for $ty {
            type Err = ParseError;

            fn from_str(s: &str) -> Result<$ty, ParseError> {
                let spec = spec(s)?;
                spec.options.done($name)?;
                Ok($ty::new(spec.count, spec.period)?)
            }
        }
    )*};
}
window_from_str!(FixedWindow: "fixed window", SlidingWindow: "sliding window", SlidingLog: "sliding log");

#[cfg(feature = "serde")]
mod de {
    use core::fmt;
    use core::marker::PhantomData;
    use core::str::FromStr;

    use serde::de::{Deserialize, Deserializer, Error, Visitor};

    use crate::{FixedWindow, Meter, Nginx, Queued, SlidingLog, SlidingWindow, TokenBucket};

    struct FromString<T>(PhantomData<T>);

    impl<T: FromStr<Err = super::ParseError>> Visitor<'_> for FromString<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a limit such as \"100/min\" or \"10r/s burst=20 nodelay\"")
        }

        fn visit_str<E: Error>(self, v: &str) -> Result<T, E> {
            v.parse().map_err(E::custom)
        }
    }

    macro_rules! deserialize_from_str {
        ($($ty:ty),*) => {$(
            /// From the string form (see [`FromStr`]).
            impl<'de> Deserialize<'de> for $ty {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                    d.deserialize_str(FromString(PhantomData))
                }
            }
        )*};
    }
    deserialize_from_str!(TokenBucket, Queued, Nginx, FixedWindow, SlidingWindow, SlidingLog, Meter);
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_written() {
        let q: TokenBucket = "100/min".parse().unwrap();
        assert_eq!(q, TokenBucket::per_minute(100).unwrap());
        let q: TokenBucket = "10r/s burst=20".parse().unwrap();
        assert_eq!(q, TokenBucket::new(Rate::per_second(10), 20).unwrap());
        let q: TokenBucket = "  5/10s   burst=1 initial=0 ".parse().unwrap();
        assert_eq!(
            q,
            TokenBucket::new(Rate::per(5, Duration::from_secs(10)), 1).unwrap().with_initial(0).unwrap()
        );
        let n: Nginx = "10r/s burst=20 nodelay".parse().unwrap();
        assert_eq!(n, Nginx::per_second(10).unwrap().burst(20).unwrap().nodelay());
        let n: Nginx = "rate=30r/m burst=5 delay=2".parse().unwrap();
        assert_eq!(n, Nginx::per_minute(30).unwrap().burst(5).unwrap().delay(2));
        let w: FixedWindow = "100/min".parse().unwrap();
        assert_eq!(w, FixedWindow::new(100, Duration::from_secs(60)).unwrap());
        let w: SlidingWindow = "10/5s".parse().unwrap();
        assert_eq!(w, SlidingWindow::new(10, Duration::from_secs(5)).unwrap());
        let l: SlidingLog = "3/250ms".parse().unwrap();
        assert_eq!(l, SlidingLog::new(3, Duration::from_millis(250)).unwrap());
    }

    #[test]
    fn every_refusal_says_what_was_wrong() {
        let e = |s: &str| s.parse::<TokenBucket>().unwrap_err();
        assert_eq!(e(""), ParseError::Empty);
        assert_eq!(e("100"), ParseError::BadRate { rate: "100".into() });
        assert_eq!(e("100/"), ParseError::BadRate { rate: "100/".into() });
        assert_eq!(e("x/s"), ParseError::BadNumber { what: "count", number: "x".into() });
        assert_eq!(e("+5/s"), ParseError::BadNumber { what: "count", number: "+5".into() });
        assert_eq!(e("5/fortnight"), ParseError::UnknownUnit { unit: "fortnight".into() });
        assert_eq!(e("5/s burst=x"), ParseError::BadNumber { what: "burst", number: "x".into() });
        assert_eq!(e("5/s burst=1 burst=2"), ParseError::DuplicateOption { option: "burst".into() });
        assert_eq!(
            e("5/s nodelay"),
            ParseError::UnknownOption { option: "nodelay".into(), algorithm: "token bucket" }
        );
        assert_eq!(e("0/s"), ParseError::Invalid(ConfigError::ZeroRate));
        assert_eq!(
            e("99999999999999999999/s"),
            ParseError::BadNumber { what: "count", number: "99999999999999999999".into() }
        );
        assert_eq!(
            e("1/999999999999d"),
            ParseError::BadNumber { what: "period", number: "999999999999d".into() }
        );
        assert_eq!("10r/h".parse::<Nginx>().unwrap_err(), ParseError::NginxUnit { period: "h".into() });
        assert!("10r/s nodelay delay=2".parse::<Nginx>().is_err());
        assert_eq!(
            "5/min burst=2".parse::<FixedWindow>().unwrap_err(),
            ParseError::UnknownOption { option: "burst=2".into(), algorithm: "fixed window" }
        );
        assert_eq!(
            "0/min".parse::<SlidingLog>().unwrap_err(),
            ParseError::Invalid(ConfigError::ZeroLimit { algorithm: "sliding log" })
        );
        for input in ["", "100", "x/s", "5/fortnight", "5/s burst=1 burst=2", "10r/h"] {
            let message = input.parse::<Nginx>().unwrap_err().to_string();
            let named = input.split_whitespace().next().map_or(true, |_| {
                input
                    .split(['/', ' ', '='])
                    .any(|p| !p.is_empty() && message.contains(p.trim_end_matches('r')))
            });
            assert!(named, "`{input}`: {message}");
        }
    }
}
