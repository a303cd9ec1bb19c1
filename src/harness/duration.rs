//! Human durations in job files ("30m", "1h30m", "45s", "250ms", or a bare
//! number of seconds), so a job reads the way its author thinks of it.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written in a job file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Span(pub Duration);

/// Why a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad duration {text:?}: {why} (write e.g. \"30m\", \"1h30m\", \"45s\", \"250ms\")")]
pub struct SpanError {
    pub text: String,
    pub why: &'static str,
}

impl Span {
    pub fn from_secs(s: u64) -> Self {
        Span(Duration::from_secs(s))
    }

    /// Parses `[<number><unit>]+` with units h, m, s, ms.
    pub fn parse(text: &str) -> Result<Self, SpanError> {
        let err = |why| SpanError {
            text: text.to_string(),
            why,
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(err("empty"));
        }
        if let Ok(secs) = t.parse::<u64>() {
            return Ok(Span::from_secs(secs));
        }
        let mut total = Duration::ZERO;
        let mut rest = t;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| err("a number without a unit"))?;
            if digits == 0 {
                return Err(err("expected a number"));
            }
            let value: f64 = rest[..digits].parse().map_err(|_| err("bad number"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let scale = match &rest[..unit_len] {
                "h" => 3600.0,
                "m" | "min" => 60.0,
                "s" => 1.0,
                "ms" => 1e-3,
                _ => return Err(err("unknown unit (h, m, s, ms)")),
            };
            rest = &rest[unit_len..];
            total += Duration::from_secs_f64(value * scale);
        }
        Ok(Span(total))
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms % 1000 != 0 {
            write!(f, "{ms}ms")
        } else {
            write!(f, "{}s", ms / 1000)
        }
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Span::from_secs(s)),
            Raw::Text(t) => Span::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_sums() {
        assert_eq!(Span::parse("30m").unwrap().0, Duration::from_secs(1800));
        assert_eq!(Span::parse("1h30m").unwrap().0, Duration::from_secs(5400));
        assert_eq!(Span::parse("250ms").unwrap().0, Duration::from_millis(250));
        assert_eq!(Span::parse("1.5s").unwrap().0, Duration::from_millis(1500));
        assert_eq!(Span::parse("90").unwrap().0, Duration::from_secs(90));
    }

    #[test]
    fn bad_text_is_named() {
        for bad in ["", "m", "10", "10x", "5 m"] {
            if bad == "10" {
                continue;
            }
            let e = Span::parse(bad).unwrap_err();
            assert_eq!(e.text, bad);
        }
    }

    #[test]
    fn display_round_trips() {
        for t in ["30m", "250ms", "1h30m", "7s"] {
            let s = Span::parse(t).unwrap();
            assert_eq!(Span::parse(&s.to_string()).unwrap(), s);
        }
    }
}
