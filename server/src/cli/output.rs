//! The one place the CLI formats output: stdout that survives a closed
//! pipe, JSON for scripts (the wire messages' own serialization), times and
//! ages for people, and the exit codes that mean something.

use std::process::ExitCode;
use std::time::Duration;

/// How verbs print, chosen once for the process by the global `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns and sentences, for people.
    #[default]
    Table,
    /// The table with more columns, where a verb has more to show (`nodes
    /// list`: conditions, taints, boot id, TPM endorsement key).
    Wide,
    /// The wire messages' own JSON, for scripts (each verb's `--json`).
    Json,
}

static FORMAT: std::sync::OnceLock<Format> = std::sync::OnceLock::new();

/// Sets the process's format (the first call wins).
pub fn set_format(f: Format) {
    let _ = FORMAT.set(f);
}

/// Whether a verb prints JSON: its own `--json`, or the global `-o json`.
pub fn json_wanted(flag: bool) -> bool {
    flag || FORMAT.get() == Some(&Format::Json)
}

/// Whether a table has its wide columns (the global `-o wide`).
pub fn wide() -> bool {
    FORMAT.get() == Some(&Format::Wide)
}

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    /// Numbers.
    Right,
}

/// A table for people: each column as wide as its widest cell (header
/// included), two spaces between columns, the last one not padded, so the
/// columns stay aligned whatever the ids, names and addresses are.
#[derive(Debug)]
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row: one cell per column (an empty cell shows as `-`).
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len());
        self.rows.push(
            cells
                .into_iter()
                .map(|c| if c.is_empty() { "-".into() } else { c })
                .collect(),
        );
    }

    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .chain([self.columns[i].0.chars().count()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.columns.len()).map(width).collect();
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut out = String::new();
            for (i, cell) in cells.enumerate() {
                let last = i + 1 == widths.len();
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                match self.columns[i].1 {
                    Align::Right => {
                        out.push_str(&" ".repeat(pad));
                        out.push_str(cell);
                    }
                    Align::Left => {
                        out.push_str(cell);
                        if !last {
                            out.push_str(&" ".repeat(pad));
                        }
                    }
                }
            }
            out.push('\n');
            out
        };
        let mut text = line(&mut self.columns.iter().map(|(h, _)| *h));
        for r in &self.rows {
            text.push_str(&line(&mut r.iter().map(String::as_str)));
        }
        text
    }
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly
/// instead of panicking.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `println!` that goes through [`emit`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::emit(&format!("{}\n", format_args!($($arg)*)))?
    };
}
pub(crate) use out;

/// A value as pretty JSON, on its own line.
pub fn json<T: serde::Serialize + ?Sized>(v: &T) -> anyhow::Result<()> {
    emit(&format!("{}\n", serde_json::to_string_pretty(v)?))
}

/// A value as JSON on one line.
pub fn json_line<T: serde::Serialize + ?Sized>(v: &T) -> anyhow::Result<()> {
    emit(&format!("{}\n", serde_json::to_string(v)?))
}

/// `text` between `before` and `after`, or nothing when it is empty.
pub fn around(before: &str, text: &str, after: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("{before}{text}{after}")
    }
}

pub use crate::words::{age, spelled, time};

/// A progress bar on stderr drawn with `template` (indicatif's), hidden
/// when stderr is no terminal or `quiet` (JSON asked for), so scripts and
/// logs see only the result.
pub fn progress(quiet: bool, template: &str) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A size in MiB with one decimal.
pub fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
}

/// The first 16 characters of a long id.
pub fn short(id: &str) -> &str {
    &id[..id.len().min(16)]
}

/// Whether a command's state is terminal.
pub fn is_terminal(state: i32) -> bool {
    bcd_proto::typed::command_state(state).is_some_and(|s| s.is_terminal())
}

/// What `commands run --wait` exits with: 0 succeeded, 1 failed, 4 expired
/// or rejected (or a state this CLI does not know).
pub fn command_exit(state: i32) -> ExitCode {
    use bcd_core::command::{Outcome, ServerState};
    match bcd_proto::typed::command_state(state) {
        Some(ServerState::Terminal(Outcome::Succeeded)) => ExitCode::SUCCESS,
        Some(ServerState::Terminal(Outcome::Failed)) => ExitCode::from(1),
        Some(
            ServerState::Terminal(Outcome::Expired | Outcome::Rejected)
            | ServerState::Pending
            | ServerState::Dispatched
            | ServerState::Acked
            | ServerState::Running,
        )
        | None => ExitCode::from(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_stays_aligned_whatever_its_cells_hold() {
        let mut t = Table::new(&[
            ("NODE", Align::Left),
            ("EPOCH", Align::Right),
            ("HOSTNAME", Align::Left),
        ]);
        t.row(vec!["nd-1".into(), "7".into(), "a".into()]);
        t.row(vec![
            "nd-a-much-longer-node-id-than-usual".into(),
            "12345".into(),
            String::new(),
        ]);
        t.row(vec![
            "nd-ü".into(),
            "0".into(),
            "gpu-host-with-a-long-name".into(),
        ]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        // Every row's second and third columns start where the header's do.
        let at = |l: &str, col: usize| {
            let chars: Vec<char> = l.chars().collect();
            let mut starts = vec![0];
            for i in 1..chars.len() {
                if chars[i] != ' ' && chars[i - 1] == ' ' && chars[..i].ends_with(&[' ', ' ']) {
                    starts.push(i);
                }
            }
            starts[col]
        };
        let header_third = at(lines[0], 2);
        for l in &lines[1..] {
            assert_eq!(at(l, 2), header_third, "{text}");
            assert!(!l.ends_with(' '), "no trailing padding: {l:?}");
        }
        // Numbers right-aligned under their header.
        assert!(lines[1].ends_with("    7  a"), "{text}");
        assert!(
            lines[2].ends_with("12345  -"),
            "an empty cell shows as -: {text}"
        );
    }

    #[test]
    fn ages_and_times_for_people() {
        assert_eq!(age(-5), "0s");
        assert_eq!(age(119_999), "119s");
        assert_eq!(age(120_000), "2m");
        assert_eq!(age(7_200_000), "2h");
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(around(" (", "x", ")"), " (x)");
        assert_eq!(around(" (", "", ")"), "");
        assert_eq!(short(&"a".repeat(64)).len(), 16);
        assert_eq!(mib(3 << 20), "3.0 MiB");
    }

    #[test]
    fn command_states_have_exit_codes() {
        use bcd_proto::v1::CommandState;
        assert_eq!(
            command_exit(CommandState::Succeeded as i32),
            ExitCode::SUCCESS
        );
        assert_eq!(command_exit(CommandState::Failed as i32), ExitCode::from(1));
        assert_eq!(
            command_exit(CommandState::Rejected as i32),
            ExitCode::from(4)
        );
        assert!(is_terminal(CommandState::Expired as i32));
        assert!(!is_terminal(CommandState::Running as i32));
        assert!(!is_terminal(0));
        assert_eq!(spelled::<CommandState>(CommandState::Acked as i32), "acked");
        assert_eq!(spelled::<CommandState>(77), "77");
    }
}
