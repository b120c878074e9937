//! Value parsers for sasctl's numeric options: a value out of range, negative or not a
//! number is refused with one line that names the option, what it accepts and what was
//! given (`--orders must be at least 1 (got -5)`), instead of clap's generic text.
//!
//! `main` prints a parser's message as it is and exits 2; see [`validation_message`].

/// A whole number in `min..=max` (which `T` must hold), as `T`.
pub fn whole<T: TryFrom<i128>>(
    flag: &'static str,
    min: i128,
    max: i128,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |given: &str| {
        let text = given.trim();
        let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
        let v: i128 = match text.parse() {
            Ok(v) => v,
            // Too long even for i128: out of range on its side.
            Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                if text.starts_with('-') { i128::MIN } else { i128::MAX }
            }
            Err(_) => return Err(format!("{flag} must be a whole number (got {given:?})")),
        };
        if v < min {
            return Err(format!("{flag} must be at least {min} (got {given})"));
        }
        if v > max {
            return Err(format!("{flag} must be at most {max} (got {given})"));
        }
        T::try_from(v).map_err(|_| format!("{flag} must be at most {max} (got {given})"))
    }
}

/// A probability: a number from 0 to 1.
pub fn rate(flag: &'static str) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |given: &str| match given.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{flag} must be a number from 0 to 1 (got {given})")),
    }
}

/// The one line to print for a clap error raised by one of the parsers above, or
/// `None` for any other error (clap's own text, usage included, is right for those).
pub fn validation_message(err: &clap::Error) -> Option<String> {
    if err.kind() != clap::error::ErrorKind::ValueValidation {
        return None;
    }
    let cause = std::error::Error::source(err)?.to_string();
    if cause.starts_with("--") {
        return Some(cause);
    }
    // A parser that does not name its option (a `FromStr`): name it here.
    use clap::error::{ContextKind, ContextValue};
    match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => {
            Some(format!("{}: {cause}", arg.split_whitespace().next().unwrap_or(arg)))
        }
        _ => Some(cause),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_checked_against_their_range() {
        let orders = whole::<usize>("--orders", 1, 1_000_000);
        assert_eq!(orders("300"), Ok(300));
        assert_eq!(orders("0").unwrap_err(), "--orders must be at least 1 (got 0)");
        assert_eq!(orders("-5").unwrap_err(), "--orders must be at least 1 (got -5)");
        assert_eq!(orders("2000000").unwrap_err(), "--orders must be at most 1000000 (got 2000000)");
        assert_eq!(orders("1.5").unwrap_err(), "--orders must be a whole number (got \"1.5\")");
        assert_eq!(orders("").unwrap_err(), "--orders must be a whole number (got \"\")");
        let seed = whole::<u64>("--seed", 0, u64::MAX.into());
        assert_eq!(seed("18446744073709551615"), Ok(u64::MAX));
        let huge = "99999999999999999999999999999999999999999";
        assert_eq!(seed(huge).unwrap_err(), format!("--seed must be at most {} (got {huge})", u64::MAX));
        assert_eq!(
            seed(&format!("-{huge}")).unwrap_err(),
            format!("--seed must be at least 0 (got -{huge})")
        );
        assert_eq!(
            seed("18446744073709551616").unwrap_err(),
            "--seed must be at most 18446744073709551615 (got 18446744073709551616)"
        );
    }

    #[test]
    fn rates_are_numbers_from_0_to_1() {
        let r = rate("--hang-rate");
        assert_eq!(r("0"), Ok(0.0));
        assert_eq!(r("1"), Ok(1.0));
        assert_eq!(r("0.25"), Ok(0.25));
        for bad in ["-0.1", "1.01", "NaN", "inf", "lots", "20%"] {
            assert_eq!(r(bad).unwrap_err(), format!("--hang-rate must be a number from 0 to 1 (got {bad})"));
        }
    }
}
