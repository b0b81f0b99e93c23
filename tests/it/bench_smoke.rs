//! `herald-bench` runs: one small scenario (`rss_idle`: `herald serve` on SQLite, idle for 3 s)
//! prints its RESULT line and writes the JSON report. The figures themselves are not judged here
//! (benchmarks are not timed tests); the command is.

#[test]
fn herald_bench_runs_a_scenario_and_writes_its_report() {
    let out = tempfile::tempdir().unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_herald-bench"))
        .args(["rss_idle", "--quick", "--out"])
        .arg(out.path())
        .env("HERALD_BENCH_HERALD", env!("CARGO_BIN_EXE_herald"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT rss_idle_mib "))
        .unwrap_or_else(|| panic!("no RESULT line in {stdout}"));
    for key in ["value=", "baseline=32", "ratio=", "unit=MiB"] {
        assert!(line.contains(key), "{line}");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("quick.json")).unwrap()).unwrap();
    assert_eq!(report["mode"], "quick");
    assert_eq!(report["results"][0]["name"], "rss_idle_mib");
    assert_eq!(report["results"][0]["line"], line);
    assert!(report["results"][0]["value"].as_f64().unwrap() > 1.0);
}
