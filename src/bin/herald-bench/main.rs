//! `herald-bench`: Herald's performance figures in one command, each as a ratio to a baseline
//! measured in the same run on the same machine (shared, noisy machines: absolute figures mean
//! little).
//!
//! `cargo run --release --bin herald-bench -- all [--quick]`, or one or more scenario names
//! instead of `all`. It starts its own throwaway PostgreSQL (fsync on) and its local peers (an
//! HTTP receiver, an SMTP server) on loopback, runs the real `herald serve` binary as child
//! processes, and prints one `RESULT <name> value=… baseline=… ratio=… unit=…` line per figure,
//! then a table, and writes the same as JSON to `target/bench/`.
//!
//! A scenario is one entry of [`SCENARIOS`]: a name and a function returning its figures.

mod peer;
mod peers;
mod pg;
mod proc;
mod scenarios;

use std::time::Instant;

use anyhow::{Context, Result, bail};

/// How a figure is judged.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// `ratio` (value / baseline) at least this.
    RatioAtLeast(f64),
    /// `value` at most this.
    AtMost(f64),
    /// `value` at least this.
    AtLeast(f64),
}

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    /// A baseline measured in this run, or — for an absolute target — the target itself
    /// (`baseline_is = "target"`), so that the ratio says how far from it.
    pub baseline: f64,
    pub baseline_is: &'static str,
    pub unit: &'static str,
    pub target: Option<Target>,
    /// Sizes, counts, anything that qualifies the figure.
    pub note: String,
}

impl Figure {
    pub fn measured(name: &str, value: f64, baseline: f64, unit: &'static str) -> Figure {
        Figure {
            name: name.into(),
            value,
            baseline,
            baseline_is: "measured",
            unit,
            target: None,
            note: String::new(),
        }
    }

    /// A figure with an absolute target: the baseline is the target.
    pub fn against_target(name: &str, value: f64, target: Target, unit: &'static str) -> Figure {
        let baseline = match target {
            Target::AtMost(t) | Target::AtLeast(t) | Target::RatioAtLeast(t) => t,
        };
        Figure {
            name: name.into(),
            value,
            baseline,
            baseline_is: "target",
            unit,
            target: Some(target),
            note: String::new(),
        }
    }

    pub fn target(mut self, t: Target) -> Figure {
        self.target = Some(t);
        self
    }

    pub fn note(mut self, n: impl Into<String>) -> Figure {
        self.note = n.into();
        self
    }

    pub fn ratio(&self) -> f64 {
        if self.baseline == 0.0 {
            f64::NAN
        } else {
            self.value / self.baseline
        }
    }

    pub fn met(&self) -> Option<bool> {
        self.target.map(|t| match t {
            Target::RatioAtLeast(r) => self.ratio() >= r,
            Target::AtMost(v) => self.value <= v,
            Target::AtLeast(v) => self.value >= v,
        })
    }

    fn target_text(&self) -> String {
        match self.target {
            Some(Target::RatioAtLeast(r)) => format!("ratio ≥ {r}"),
            Some(Target::AtMost(v)) => format!("≤ {v}"),
            Some(Target::AtLeast(v)) => format!("≥ {v}"),
            None => "—".into(),
        }
    }
}

/// Run sizes: `--quick` (about two minutes) or the full run.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub quick: bool,
    pub dispatch_messages: usize,
    pub procs_messages: usize,
    pub window_secs: u64,
    pub latency_secs: u64,
    pub claim_rows: usize,
    pub email_messages: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                quick,
                dispatch_messages: 20_000,
                procs_messages: 10_000,
                window_secs: 5,
                latency_secs: 5,
                claim_rows: 250_000,
                email_messages: 4_000,
            }
        } else {
            Sizes {
                quick,
                dispatch_messages: 50_000,
                procs_messages: 20_000,
                window_secs: 10,
                latency_secs: 10,
                claim_rows: 1_000_000,
                email_messages: 10_000,
            }
        }
    }
}

/// What every scenario gets: the sizes, the PostgreSQL cluster (started on first use), a
/// runtime, and the figures of scenarios already run (a baseline measured once is reused).
pub struct Ctx {
    pub sizes: Sizes,
    pub rt: tokio::runtime::Runtime,
    cluster: Option<pg::Cluster>,
    pub figures: Vec<Figure>,
    pub work_dir: std::path::PathBuf,
    pub http_baseline: Option<f64>,
    /// The same from a process of its own.
    pub http_baseline_in_child: Option<f64>,
}

impl Ctx {
    pub fn cluster(&mut self) -> Result<&pg::Cluster> {
        if self.cluster.is_none() {
            self.cluster = Some(pg::Cluster::start()?);
        }
        self.cluster.as_ref().context("cluster")
    }
}

pub type ScenarioFn = fn(&mut Ctx) -> Result<Vec<Figure>>;

/// Every scenario, in the order `all` runs them. Add one here.
pub const SCENARIOS: &[(&str, ScenarioFn)] = &[
    ("rss_idle", scenarios::rss_idle),
    ("dispatch_pg", scenarios::dispatch_pg),
    ("dispatch_pg_procs", scenarios::dispatch_pg_procs),
    ("dispatch_pg_keyed", scenarios::dispatch_pg_keyed),
    ("ingest_pg", scenarios::ingest_pg),
    ("ingest_pg_matched", scenarios::ingest_pg_matched),
    ("enqueue_pg", scenarios::enqueue_pg),
    ("app_insert_pg", scenarios::app_insert_pg),
    ("latency", scenarios::latency),
    ("claim", scenarios::claim_at_1m),
    ("dispatch_sqlite", scenarios::dispatch_sqlite),
    ("ingest_sqlite", scenarios::ingest_sqlite),
    ("latency_sqlite", scenarios::latency_sqlite),
    ("enqueue_sqlite", scenarios::enqueue_sqlite),
    ("enqueue_sqlite_keyed", scenarios::enqueue_sqlite_keyed),
    ("email_smtp", scenarios::email_smtp),
    ("email_smtp_api", scenarios::email_smtp_api),
    ("email_smtp_rtt", scenarios::email_smtp_rtt),
];

/// Scenarios run only when named: they need more than the machine's PostgreSQL (a peer's
/// runtime, a package registry).
pub const BY_NAME_ONLY: &[(&str, ScenarioFn)] = &[("peer_graphile", peer::graphile)];

fn scenario(name: &str) -> Option<ScenarioFn> {
    SCENARIOS
        .iter()
        .chain(BY_NAME_ONLY)
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

fn usage() -> String {
    let names: Vec<_> = SCENARIOS.iter().map(|(n, _)| *n).collect();
    let named: Vec<_> = BY_NAME_ONLY.iter().map(|(n, _)| *n).collect();
    format!(
        "usage: herald-bench all|SCENARIO... [--quick] [--repeat N] [--out DIR]\nscenarios: {}\nby name only (not in all): {}",
        names.join(", "),
        named.join(", ")
    )
}

fn main() -> Result<()> {
    let mut quick = false;
    let mut repeat = 1usize;
    let mut out = std::path::PathBuf::from("target/bench");
    let mut chosen: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1).peekable();
    if args.next_if_eq(scenarios::CLIENT_CHILD).is_some() {
        return scenarios::client_child(args);
    }
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = args.next().context("--out needs a directory")?.into(),
            "--repeat" => {
                repeat = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=99).contains(n))
                    .context("--repeat needs a count from 1 to 99")?
            }
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(());
            }
            "all" => chosen.extend(SCENARIOS.iter().map(|(n, _)| n.to_string())),
            other if scenario(other).is_some() => chosen.push(other.into()),
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    if chosen.is_empty() {
        bail!("{}", usage());
    }
    herald::channels::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let work_dir = std::env::temp_dir().join(format!("herald-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work_dir)?;
    let mut ctx = Ctx {
        sizes: Sizes::new(quick),
        rt,
        cluster: None,
        figures: Vec::new(),
        work_dir: work_dir.clone(),
        http_baseline: None,
        http_baseline_in_child: None,
    };
    let started = Instant::now();
    let mut failed = Vec::new();
    for name in &chosen {
        let Some(run) = scenario(name) else {
            continue;
        };
        eprintln!("== {name}");
        let t = Instant::now();
        let mut runs = Vec::new();
        let mut error = None;
        for i in 1..=repeat {
            if repeat > 1 {
                // Each run measures its own HTTP baselines, so that every figure is paired with
                // a baseline of its own window.
                ctx.http_baseline = None;
                ctx.http_baseline_in_child = None;
                eprintln!("   run {i} of {repeat}");
            }
            let r = run(&mut ctx);
            if let Some(c) = &ctx.cluster
                && let Err(e) = c.drop_databases()
            {
                eprintln!("   could not drop the scenario's databases: {e:#}");
            }
            match r {
                Ok(figs) => {
                    if repeat > 1 {
                        for f in &figs {
                            eprintln!("   {}", result_line(f));
                        }
                    }
                    runs.push(figs);
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        match error {
            None => {
                let figs = median_figures(runs);
                for f in &figs {
                    println!("{}", result_line(f));
                }
                ctx.figures.extend(figs);
            }
            Some(e) => {
                eprintln!("scenario {name} failed: {e:#}");
                failed.push(name.clone());
            }
        }
        eprintln!("   ({:.1} s)", t.elapsed().as_secs_f64());
    }
    print_table(&ctx.figures, quick, started.elapsed().as_secs_f64());
    std::fs::create_dir_all(&out)?;
    let file = out.join(if quick { "quick.json" } else { "all.json" });
    std::fs::write(&file, to_json(&ctx.figures, quick, &failed)?)?;
    println!("written: {}", file.display());
    let _ = std::fs::remove_dir_all(&work_dir);
    if !failed.is_empty() {
        bail!("scenarios failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Each figure of a scenario run several times (`--repeat`): the run whose ratio (value over
/// its own run's baseline) is the median — the lower of the two middle ones for an even count —
/// with every run's ratio, in run order, added to its note. Each figure is chosen on its own, so
/// two figures of one scenario may come from different runs. One run: its figures unchanged.
fn median_figures(runs: Vec<Vec<Figure>>) -> Vec<Figure> {
    if runs.len() <= 1 {
        return runs.into_iter().flatten().collect();
    }
    let names: Vec<String> = runs[0].iter().map(|f| f.name.clone()).collect();
    names
        .iter()
        .filter_map(|name| {
            let of: Vec<&Figure> = runs
                .iter()
                .filter_map(|r| r.iter().find(|f| &f.name == name))
                .collect();
            let mut order: Vec<&Figure> = of.clone();
            order.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
            let mut f = (*order.get((order.len() - 1) / 2)?).clone();
            let ratios: Vec<String> = of.iter().map(|f| num(f.ratio())).collect();
            let how = format!(
                "median of {} runs by ratio ({})",
                of.len(),
                ratios.join(", ")
            );
            f.note = if f.note.is_empty() {
                how
            } else {
                format!("{}; {how}", f.note)
            };
            Some(f)
        })
        .collect()
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        "nan".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

pub fn result_line(f: &Figure) -> String {
    format!(
        "RESULT {} value={} baseline={} ratio={} unit={}",
        f.name,
        num(f.value),
        num(f.baseline),
        num(f.ratio()),
        f.unit
    )
}

fn print_table(figs: &[Figure], quick: bool, secs: f64) {
    println!();
    println!(
        "herald-bench {} — {:.0} s; machine: {} cores, {}",
        if quick { "--quick" } else { "all" },
        secs,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        cpu_model()
    );
    println!(
        "| {:<26} | {:>10} | {:>10} | {:<8} | {:>8} | {:<10} | {:<14} | {:<4} | note",
        "figure", "value", "baseline", "of", "ratio", "unit", "target", "met"
    );
    println!("|{}|", "-".repeat(120));
    for f in figs {
        let met = match f.met() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        println!(
            "| {:<26} | {:>10} | {:>10} | {:<8} | {:>8} | {:<10} | {:<14} | {:<4} | {}",
            f.name,
            num(f.value),
            num(f.baseline),
            f.baseline_is,
            num(f.ratio()),
            f.unit,
            f.target_text(),
            met,
            f.note
        );
    }
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn to_json(figs: &[Figure], quick: bool, failed: &[String]) -> Result<String> {
    let results: Vec<_> = figs
        .iter()
        .map(|f| {
            serde_json::json!({
                "name": f.name,
                "value": f.value,
                "baseline": f.baseline,
                "baseline_is": f.baseline_is,
                "ratio": f.ratio(),
                "unit": f.unit,
                "target": f.target_text(),
                "met": f.met(),
                "note": f.note,
                "line": result_line(f),
            })
        })
        .collect();
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "mode": if quick { "quick" } else { "all" },
        "at": chrono::Utc::now().to_rfc3339(),
        "machine": {
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "cpu": cpu_model(),
        },
        "results": results,
        "failed": failed,
    }))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(name: &str, value: f64, baseline: f64) -> Figure {
        Figure::measured(name, value, baseline, "msg/s").note("n rows")
    }

    #[test]
    fn one_run_is_kept_as_it_is() {
        let figs = median_figures(vec![vec![fig("a", 1.0, 4.0), fig("b", 2.0, 4.0)]]);
        assert_eq!(figs.len(), 2);
        assert_eq!((figs[0].value, figs[0].note.as_str()), (1.0, "n rows"));
        assert_eq!((figs[1].value, figs[1].note.as_str()), (2.0, "n rows"));
    }

    #[test]
    fn each_figure_is_its_median_run_by_ratio_with_every_runs_ratio_in_its_note() {
        // By value "a"'s median run would be the third (35 of 30, 40, 35); against each run's
        // own baseline it is the first (0.3 of 0.3, 0.8, 0.175).
        let runs = vec![
            vec![fig("a", 30.0, 100.0), fig("b", 5.0, 10.0)],
            vec![fig("a", 40.0, 50.0), fig("b", 9.0, 10.0)],
            vec![fig("a", 35.0, 200.0), fig("b", 1.0, 10.0)],
        ];
        let figs = median_figures(runs);
        assert_eq!(figs.len(), 2);
        let a = &figs[0];
        assert_eq!((a.name.as_str(), a.value, a.baseline), ("a", 30.0, 100.0));
        assert_eq!(
            a.note,
            "n rows; median of 3 runs by ratio (0.3000, 0.8000, 0.1750)"
        );
        let b = &figs[1];
        assert_eq!((b.name.as_str(), b.value, b.baseline), ("b", 5.0, 10.0));
    }

    #[test]
    fn an_even_count_takes_the_lower_middle_run_and_an_absolute_figure_orders_by_value() {
        let t = |v| Figure::against_target("us", v, Target::AtMost(15.0), "us");
        let figs = median_figures(vec![
            vec![t(52.0)],
            vec![t(49.0)],
            vec![t(61.0)],
            vec![t(50.0)],
        ]);
        assert_eq!(figs[0].value, 50.0);
        assert_eq!(
            figs[0].note,
            "median of 4 runs by ratio (3.47, 3.27, 4.07, 3.33)"
        );
    }
}
