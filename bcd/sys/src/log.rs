//! Logging set-up, the same for every binary: `tracing` to stderr, filtered
//! by target=level directives from an environment variable, as text (with
//! colour on a terminal) or as JSON lines.
//!
//! What the levels mean, everywhere:
//! - `error`: the process cannot do its job and a person has to act (a
//!   journal that fails, a refused identity);
//! - `warn`: something failed and is retried, or a peer sent something that
//!   was refused (a failed renewal, a spec refused, a drifted section);
//! - `info`: a state change worth keeping (session established, command
//!   finished, certificate renewed, release switched);
//! - `debug`: per-message detail for tracing one node's behaviour;
//! - `trace`: not used by our code; dependencies' wire detail.
//!
//! What a peer can trigger repeatedly (dial failures, refused messages) is
//! logged at `debug`, or at `warn` once per state change, so a hostile or
//! broken peer cannot flood the log.

/// Where a binary reads its logging settings from.
#[derive(Debug, Clone, Copy)]
pub struct LogConfig {
    /// The filter variable, e.g. `BCD_LOG=info,bcd_agent=debug`.
    pub filter_var: &'static str,
    /// The format variable: `json` for JSON lines, anything else for text.
    pub format_var: &'static str,
    /// The level when the filter variable is unset or does not parse.
    pub default: tracing::Level,
    /// Targets held at most at a level whatever the variable says (a
    /// dependency whose lines repeat what our own say better).
    pub capped: &'static [(&'static str, tracing::Level)],
}

impl LogConfig {
    /// `bcd`: `BCD_LOG`, `BCD_LOG_FORMAT`, `info` by default.
    pub const BCD: LogConfig = LogConfig {
        filter_var: "BCD_LOG",
        format_var: "BCD_LOG_FORMAT",
        default: tracing::Level::INFO,
        capped: &[],
    };
}

impl LogConfig {
    /// The filter from the variable's `value`, with the capped targets.
    pub fn targets(&self, value: Option<&str>) -> tracing_subscriber::filter::Targets {
        self.capped
            .iter()
            .fold(filter(value, self.default), |f, (target, level)| {
                f.with_target(*target, *level)
            })
    }
}

/// The filter from `value` (`info`, `debug`, `info,bcd_agent=debug`), or
/// `default` for every target when it is missing or does not parse.
pub fn filter(value: Option<&str>, default: tracing::Level) -> tracing_subscriber::filter::Targets {
    value
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| tracing_subscriber::filter::Targets::new().with_default(default))
}

/// Installs the global subscriber. Call once, early in `main`.
pub fn init(config: LogConfig) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = config.targets(std::env::var(config.filter_var).ok().as_deref());
    let fmt = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if std::env::var(config.format_var).as_deref() == Ok("json") {
        fmt.json().finish().with(filter).init();
    } else {
        fmt.finish().with(filter).init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::filter::LevelFilter;

    #[test]
    fn directives_parse_and_garbage_falls_back_to_the_default() {
        let f = filter(Some("warn,bcd_agent=debug"), Level::INFO);
        assert!(f.would_enable("bcd_agent::node", &Level::DEBUG));
        assert!(!f.would_enable("tonic", &Level::INFO));
        let f = filter(Some("=nonsense=="), Level::INFO);
        assert!(f.would_enable("anything", &Level::INFO));
        assert!(!f.would_enable("anything", &Level::DEBUG));
        assert_eq!(
            filter(None, Level::WARN).default_level(),
            Some(LevelFilter::WARN)
        );
    }

    #[test]
    fn a_capped_target_stays_capped_whatever_the_variable_says() {
        let config = LogConfig {
            filter_var: "X_LOG",
            format_var: "X_LOG_FORMAT",
            default: Level::INFO,
            capped: &[("deadpool", Level::ERROR)],
        };
        let f = config.targets(Some("debug"));
        assert!(f.would_enable("bc_store", &Level::DEBUG));
        assert!(!f.would_enable("deadpool::managed", &Level::WARN));
        assert!(f.would_enable("deadpool", &Level::ERROR));
    }
}
