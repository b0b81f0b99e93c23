//! The attempts chart: attempts by class per hour over the last 24 hours, as inline SVG drawn on
//! the server (no script; colours come from the stylesheet's `k-<class>` rules, so the strict
//! CSP needs no inline style).

use chrono::{DateTime, TimeZone, Utc};
use maud::{Markup, html};

use crate::domain::AttemptClass;
use crate::storage::admin::HourCount;

/// How many hours the chart covers, the current one included.
pub const HOURS: i64 = 24;

/// One hour's bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub hour_start: DateTime<Utc>,
    /// Classes with a non-zero count, in [`AttemptClass::ALL`] order.
    pub segments: Vec<(AttemptClass, i64)>,
}

impl Column {
    pub fn total(&self) -> i64 {
        self.segments.iter().map(|(_, n)| n).sum()
    }
}

/// The start of the first hour the chart shows at `now`.
pub fn since(now: DateTime<Utc>) -> DateTime<Utc> {
    hour_start(now.timestamp().div_euclid(3600) - (HOURS - 1))
}

fn hour_start(hour: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(hour * 3600, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// The [`HOURS`] columns ending with `now`'s hour, from the counted rows (rows outside the window
/// and classes Herald does not know are left out).
pub fn columns(now: DateTime<Utc>, counts: &[HourCount]) -> Vec<Column> {
    let last = now.timestamp().div_euclid(3600);
    (last - (HOURS - 1)..=last)
        .map(|hour| Column {
            hour_start: hour_start(hour),
            segments: AttemptClass::ALL
                .iter()
                .filter_map(|&class| {
                    let n: i64 = counts
                        .iter()
                        .filter(|c| c.hour == hour && c.class == class.as_str())
                        .map(|c| c.n)
                        .sum();
                    (n > 0).then_some((class, n))
                })
                .collect(),
        })
        .collect()
}

/// Each class's total over the window, in [`AttemptClass::ALL`] order (zeros included).
pub fn totals(columns: &[Column]) -> Vec<(AttemptClass, i64)> {
    AttemptClass::ALL
        .iter()
        .map(|&class| {
            let n = columns
                .iter()
                .flat_map(|c| &c.segments)
                .filter(|(k, _)| *k == class)
                .map(|(_, n)| n)
                .sum();
            (class, n)
        })
        .collect()
}

const WIDTH: i64 = 720;
const PLOT_HEIGHT: i64 = 140;
const TOP: i64 = 10;
const LABELS: i64 = 20;

/// A column's segments bottom up: class, count, top edge and height (at least one pixel).
fn stack(c: &Column, base: i64, max: i64) -> Vec<(AttemptClass, i64, i64, i64)> {
    let mut y = base;
    c.segments
        .iter()
        .map(|&(class, n)| {
            let h = (n * PLOT_HEIGHT / max).max(1);
            y -= h;
            (class, n, y, h)
        })
        .collect()
}

/// The chart as an `<svg>` element with a legend.
pub fn render(columns: &[Column]) -> Markup {
    let max = columns.iter().map(Column::total).max().unwrap_or(0).max(1);
    let slot = WIDTH / columns.len().max(1) as i64;
    let bar = (slot - 4).max(1);
    let base = TOP + PLOT_HEIGHT;
    let total: i64 = columns.iter().map(Column::total).sum();
    html! {
        figure.chart {
            svg viewBox=(format!("0 0 {WIDTH} {}", base + LABELS)) role="img"
                aria-label=(format!("Attempts by class per hour, last {HOURS} hours: {total} in all")) {
                line.axis x1="0" y1=(base) x2=(WIDTH) y2=(base) {}
                text.axis x="2" y=(TOP + 2) { (max) }
                @for (i, c) in columns.iter().enumerate() {
                    @let x = i as i64 * slot + 2;
                    @for (class, n, top, h) in stack(c, base, max) {
                        rect class=(format!("k-{class}")) x=(x) y=(top) width=(bar) height=(h) {
                            title { (c.hour_start.format("%Y-%m-%d %H:00 UTC")) " — " (class) ": " (n) }
                        }
                    }
                    @if i % 6 == 0 {
                        text.axis x=(x) y=(base + LABELS - 4) { (c.hour_start.format("%H:00")) }
                    }
                }
            }
            figcaption {
                "Attempts by class per hour, last " (HOURS) " hours (UTC): "
                // `exhausted` is a message's class, not an attempt's: named only if counted.
                @for (class, n) in totals(columns).into_iter().filter(|&(k, n)| n > 0 || k != AttemptClass::Exhausted) {
                    span class=(format!("legend k-{class}")) { (class) " " (n) }
                    " "
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn count(t: &str, class: &str, n: i64) -> HourCount {
        HourCount {
            hour: at(t).timestamp() / 3600,
            class: class.into(),
            n,
        }
    }

    #[test]
    fn twenty_four_hours_ending_with_the_current_one() {
        let now = at("2026-12-01T10:59:59Z");
        assert_eq!(since(now), at("2026-11-30T11:00:00Z"));
        let cols = columns(
            now,
            &[
                count("2026-12-01T10:05:00Z", "permanent", 2),
                count("2026-12-01T10:05:00Z", "accepted", 5),
                count("2026-11-30T11:00:00Z", "transient", 1),
                count("2026-11-30T10:59:00Z", "transient", 9), // before the window
                count("2026-12-01T10:05:00Z", "no_such_class", 9),
            ],
        );
        assert_eq!(cols.len(), 24);
        assert_eq!(cols[0].hour_start, at("2026-11-30T11:00:00Z"));
        assert_eq!(cols[0].segments, [(AttemptClass::Transient, 1)]);
        assert_eq!(cols[23].hour_start, at("2026-12-01T10:00:00Z"));
        assert_eq!(
            cols[23].segments,
            [(AttemptClass::Accepted, 5), (AttemptClass::Permanent, 2)]
        );
        assert!(cols[1..23].iter().all(|c| c.total() == 0));
        let t = totals(&cols);
        assert_eq!(t.len(), AttemptClass::ALL.len());
        assert!(t.contains(&(AttemptClass::Accepted, 5)));
        assert!(t.contains(&(AttemptClass::Conflict, 0)));
    }

    #[test]
    fn renders_one_rect_per_segment_and_no_inline_style() {
        let now = at("2026-12-01T10:30:00Z");
        let svg = render(&columns(
            now,
            &[
                count("2026-12-01T10:05:00Z", "permanent", 2),
                count("2026-12-01T09:05:00Z", "accepted", 4),
            ],
        ))
        .into_string();
        assert_eq!(svg.matches("<rect").count(), 2, "{svg}");
        assert!(svg.contains("class=\"k-permanent\""));
        assert!(svg.contains("2026-12-01 10:00 UTC — permanent: 2"));
        assert!(!svg.contains("style="), "the CSP allows no inline style");
        // The tallest bar fills the plot.
        assert!(svg.contains(&format!("height=\"{PLOT_HEIGHT}\"")), "{svg}");
        let empty = render(&columns(now, &[])).into_string();
        assert_eq!(empty.matches("<rect").count(), 0);
        // The legend names every attempt class, counted or not, but `exhausted` (a message's
        // class: it was always "exhausted 0") only when counted.
        assert!(
            empty.contains("legend k-permanent\">permanent 0<"),
            "{empty}"
        );
        assert!(!empty.contains("exhausted"), "{empty}");
        let counted = render(&columns(
            now,
            &[count("2026-12-01T10:05:00Z", "exhausted", 1)],
        ));
        assert!(counted.into_string().contains(">exhausted 1<"));
    }
}
