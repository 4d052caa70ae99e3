//! The benchmark plots in the README are drawn by `scripts/plot-bench`
//! from the `bc-sim --json` reports committed under tests/bench/reports:
//! the script runs on them and draws every plot, and the committed plots
//! are what it draws from them.

use std::path::Path;
use std::process::Command;

#[test]
fn the_committed_plots_are_what_the_script_draws_from_the_committed_reports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "/usr/bin/python3 is missing: install Debian's python3-matplotlib (scripts/test does)"
    );
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(python)
        .arg(root.join("scripts/plot-bench"))
        .arg(root.join("tests/bench/reports"))
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    for name in ["rehome-cdf.svg", "storm.svg", "scale.svg"] {
        let drawn = std::fs::read_to_string(out.path().join(name)).unwrap();
        assert!(drawn.contains("<svg"), "{name}");
        let committed = std::fs::read_to_string(root.join("tests/bench/plots").join(name))
            .unwrap_or_else(|e| panic!("tests/bench/plots/{name}: {e}"));
        assert_eq!(
            drawn, committed,
            "tests/bench/plots/{name} is not what scripts/plot-bench draws from the reports: \
             run scripts/plot-bench and commit the plots"
        );
    }
}
