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

/// A duration such as `90s`, `15m`, `2h` or `3d`: a whole number and one unit (s, m, h,
/// d), at least a second and at most 3650 days.
pub fn duration(
    flag: &'static str,
) -> impl Fn(&str) -> Result<std::time::Duration, String> + Clone + Send + Sync + 'static {
    move |given: &str| {
        let bad = || {
            format!(
                "{flag} must be a whole number and a unit s, m, h or d, e.g. 90s, 15m, 2h, 3d (got {given:?})"
            )
        };
        let text = given.trim();
        let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let per: u64 = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3_600,
            "d" => 86_400,
            _ => return Err(bad()),
        };
        let secs = n.checked_mul(per).filter(|s| (1..=3_650 * 86_400).contains(s));
        secs.map(std::time::Duration::from_secs)
            .ok_or_else(|| format!("{flag} must be from 1s to 3650d (got {given})"))
    }
}

/// Text that must say something: not empty, not only blanks.
pub fn non_empty(
    flag: &'static str,
) -> impl Fn(&str) -> Result<String, String> + Clone + Send + Sync + 'static {
    move |given: &str| {
        let text = given.trim();
        if text.is_empty() { Err(format!("{flag} must not be empty")) } else { Ok(text.to_owned()) }
    }
}

/// `cmd` and its subcommands with each option's environment variable dropped where
/// `env` finds it set but blank: `SAS_WORKFLOWS=` means unset, as a blank SAS_STACK or
/// SAS_PREFIX does, rather than a value to check (clap would report it as a
/// `--workflows ''` the user never typed). `main` passes the process's environment.
pub fn without_blank_env(
    cmd: clap::Command,
    env: &dyn Fn(&std::ffi::OsStr) -> Option<std::ffi::OsString>,
) -> clap::Command {
    let blank: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.get_env().and_then(env).is_some_and(|v| v.to_string_lossy().trim().is_empty()))
        .map(|a| a.get_id().to_string())
        .collect();
    let cmd = blank.into_iter().fold(cmd, |cmd, id| cmd.mut_arg(id, |a| a.env(None::<&'static str>)));
    cmd.mut_subcommands(|sub| without_blank_env(sub, env))
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

/// One line for an argument missing or given with one it excludes (`--reason` left out,
/// an ID with `--state`), instead of clap's text with its usage block. `None` for any
/// other error.
pub fn usage_message(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let names = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    };
    match err.kind() {
        ErrorKind::MissingRequiredArgument => {
            let missing = names(ContextKind::InvalidArg);
            Some(format!("missing {} (see --help)", missing.join(", ")))
        }
        ErrorKind::ArgumentConflict => {
            let arg = names(ContextKind::InvalidArg).join(", ");
            let prior = names(ContextKind::PriorArg).join(", ");
            Some(format!("{arg} cannot be used with {prior} (see --help)"))
        }
        _ => None,
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

    #[test]
    fn durations_take_one_unit() {
        let d = duration("--since");
        assert_eq!(d("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(d("15m"), Ok(std::time::Duration::from_secs(900)));
        assert_eq!(d("2h"), Ok(std::time::Duration::from_secs(7_200)));
        assert_eq!(d("3d"), Ok(std::time::Duration::from_secs(259_200)));
        for bad in ["", "2", "h", "2 h", "2H", "-2h", "1.5h", "2hours", "2h30m"] {
            let e = d(bad).unwrap_err();
            assert!(e.starts_with("--since must be a whole number and a unit s, m, h or d"), "{bad}: {e}");
        }
        assert_eq!(d("0s").unwrap_err(), "--since must be from 1s to 3650d (got 0s)");
        assert_eq!(d("3651d").unwrap_err(), "--since must be from 1s to 3650d (got 3651d)");
        assert!(d("99999999999999999999d").is_err());
    }

    #[test]
    fn a_blank_variable_counts_as_unset() {
        let cmd = || {
            clap::Command::new("t").subcommand(
                clap::Command::new("list")
                    .arg(clap::Arg::new("workflows").long("workflows").env("SASCTL_TEST_WORKFLOWS"))
                    .arg(clap::Arg::new("shards").long("shards").env("SASCTL_TEST_SHARDS")),
            )
        };
        let env = |name: &std::ffi::OsStr| match name.to_str() {
            Some("SASCTL_TEST_WORKFLOWS") => Some(" ".into()),
            Some("SASCTL_TEST_SHARDS") => Some("8".into()),
            _ => None,
        };
        let cmd = without_blank_env(cmd(), &env);
        let list = cmd.find_subcommand("list").unwrap();
        let var = |id: &str| {
            list.get_arguments().find(|a| a.get_id() == id).unwrap().get_env().map(|v| v.to_owned())
        };
        assert_eq!(var("workflows"), None);
        assert_eq!(var("shards"), Some("SASCTL_TEST_SHARDS".into()));
    }

    #[test]
    fn text_must_say_something() {
        let r = non_empty("--reason");
        assert_eq!(r(" remote fixed "), Ok("remote fixed".to_owned()));
        assert_eq!(r("  ").unwrap_err(), "--reason must not be empty");
    }
}
