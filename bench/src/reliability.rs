//! The reliability section of `BENCHMARKS.md`: `reliability.json`, written by
//! `bundle/reliability.sh` (sanitizer runs and negative controls), rendered as a table.

use serde::Deserialize;
use std::fmt::Write;
use std::path::Path;

/// The file's name in the results folder (it is not a benchmark results file).
pub const FILE: &str = "reliability.json";

/// `reliability.json`: the top level of a results file, rows of sanitizer runs.
#[derive(Deserialize)]
struct ReliabilityFile {
    device: String,
    driver: String,
    commit: String,
    date: String,
    #[serde(default)]
    notes: Vec<String>,
    rows: Vec<ReliabilityRow>,
}

/// One sanitizer run of a test executable, or one negative control.
#[derive(Deserialize)]
struct ReliabilityRow {
    kernel: String,
    tool: String,
    errors: u64,
    hazards: u64,
    status: String,
    #[serde(default)]
    seconds: u64,
}

/// The markdown section for `dir/reliability.json`, or `None` when there is no such file.
pub fn section(dir: &Path) -> Result<Option<String>, String> {
    let path = dir.join(FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let f: ReliabilityFile =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut md = String::from("\n## reliability\n\n");
    writeln!(
        md,
        "{} (driver {}), commit `{}`, {}. compute-sanitizer over every GPU test executable, \
         and the negative controls (kernels with a deliberate race, which must be caught): \
         written by `bundle/reliability.sh`.\n",
        f.device, f.driver, f.commit, f.date
    )
    .unwrap();
    md.push_str("| test binary / control | tool | errors | hazards | seconds | status |\n");
    md.push_str("|---|---|---:|---:|---:|---|\n");
    for r in &f.rows {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            r.kernel, r.tool, r.errors, r.hazards, r.seconds, r.status
        )
        .unwrap();
    }
    for n in &f.notes {
        writeln!(md, "\n- note: {n}").unwrap();
    }
    Ok(Some(md))
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_a_sweep() {
        let dir = std::env::temp_dir().join(format!("kbench-rel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(super::section(&dir).unwrap(), None);
        std::fs::write(
            dir.join(super::FILE),
            r#"{"device": "NVIDIA H100", "driver": "580", "commit": "abc", "date": "d",
                "family": "reliability", "ptx_target": "", "notes": ["n"],
                "rows": [{"kernel": "smoke", "tool": "racecheck", "errors": 0, "hazards": 0,
                          "status": "clean", "seconds": 3}]}"#,
        )
        .unwrap();
        let md = super::section(&dir).unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            md.contains("| smoke | racecheck | 0 | 0 | 3 | clean |"),
            "{md}"
        );
    }
}
