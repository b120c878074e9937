//! `bench map`: one map step over 1,000 items (issue 39, "Measured"). A list step whose
//! bench remote answers `--items` lines (`{"lines": [0, 1, ...]}`, under 4 KiB for 1,000),
//! then a map of one compensable step over them, `--concurrency` items at a time
//! (`rig::LIST_MAP_10`, `LIST_MAP_50`). The rig on the system clock, the remote answering
//! at once, one order alone: what is timed is sas's own work per item (the items' claims,
//! replies and dispatches), not a network's or a service's.
//!
//! Figures, per run: wall time from the first item's call to the last, and the items'
//! calls per second over it; the whole run's wall and CPU time; the scheduler's messages
//! and the write conflicts; and the map's record, write by write, as DynamoDB counts it:
//! the largest, the write units of all the order's writes (each billed on the larger of
//! the item before and after), and the least time DynamoDB's limit of 1,000 write units a
//! second on one item allows them: a floor on the map's time on DynamoDB, whatever the
//! service's speed.

use std::fmt;
use std::time::Instant;

use serde::Serialize;

use sas::adapters::embedded::capacity::{ITEM_WRITE_UNITS_PER_SECOND, task_item_bytes, write_units};
use sas::domain::ProcessState;

use super::measure::{cpu_time, median};
use super::rig::{LIST_MAP_10, LIST_MAP_50, Rig, RigOptions};

#[derive(Debug, Clone, Serialize)]
pub struct MapRun {
    pub concurrency: u32,
    pub items: usize,
    pub processed: bool,
    /// Calls of the map's items (one each: the remote never fails here).
    pub item_calls: u64,
    /// From the first item's call to the last, ms, and the items' calls a second over it.
    pub first_to_last_ms: f64,
    pub item_calls_per_second: f64,
    /// The whole run (the order's intake, the list step, the map, the end), wall and CPU.
    pub run_ms: f64,
    pub cpu_us_per_item: f64,
    pub scheduler_messages: u64,
    pub write_conflicts: u64,
    /// The order's task writes, the largest record among them (DynamoDB's count, by the
    /// embedded store's model of it), and their write units.
    pub writes: usize,
    pub largest_record_bytes: usize,
    pub write_units: u64,
    /// The least time those units take at one item's 1,000 write units a second.
    pub dynamodb_floor_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapConcurrency {
    pub concurrency: u32,
    pub runs: Vec<MapRun>,
    pub median_first_to_last_ms: f64,
    pub median_item_calls_per_second: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapReport {
    pub items: usize,
    pub repeats: usize,
    pub by_concurrency: Vec<MapConcurrency>,
}

/// The bench's workflow for a cap: 10 or 50 items at a time.
fn workflow(concurrency: u32) -> Result<&'static str, String> {
    match concurrency {
        10 => Ok(LIST_MAP_10),
        50 => Ok(LIST_MAP_50),
        other => Err(format!("--concurrency {other}: the bench's maps run 10 or 50 items at a time")),
    }
}

/// One order's map of `items` items, `concurrency` at a time.
pub async fn map_once(items: usize, concurrency: u32, seed: u64) -> Result<MapRun, String> {
    let options = RigOptions {
        workflow: workflow(concurrency)?.into(),
        seed,
        list_items: items,
        round_trips: true,
        ..RigOptions::default()
    };
    let rig = Rig::new(options, false);
    rig.send_orders(0, 1).await;
    let cpu = cpu_time();
    let started = Instant::now();
    rig.drain().await;
    let run_ms = started.elapsed().as_secs_f64() * 1e3;
    let cpu = (cpu_time() - cpu).as_secs_f64();
    let processed = rig.store.state_counts().get(&ProcessState::Processed) == Some(&1);
    let item_calls = rig.remote.item_calls.load(std::sync::atomic::Ordering::Relaxed);
    let span = *rig.remote.item_span.lock().unwrap_or_else(|p| p.into_inner());
    let first_to_last_ms = span.map_or(0.0, |(first, last)| (last - first).as_secs_f64() * 1e3);
    let writes = rig.store.take_writes();
    let mut largest = 0;
    let mut units = 0;
    for w in &writes {
        let after = task_item_bytes(&w.after);
        let before = w.before.as_deref().map_or(0, task_item_bytes);
        largest = largest.max(after);
        units += write_units(after.max(before));
    }
    let counted = rig.metrics.snapshot();
    Ok(MapRun {
        concurrency,
        items,
        processed,
        item_calls,
        first_to_last_ms,
        item_calls_per_second: if first_to_last_ms > 0.0 {
            item_calls.saturating_sub(1) as f64 * 1e3 / first_to_last_ms
        } else {
            0.0
        },
        run_ms,
        cpu_us_per_item: cpu * 1e6 / items.max(1) as f64,
        scheduler_messages: rig.handler_times().get("scheduler").map_or(0, |h| h.messages),
        write_conflicts: counted.count(sas::ports::Metric::WriteConflict),
        writes: writes.len(),
        largest_record_bytes: largest,
        write_units: units,
        dynamodb_floor_s: units as f64 / ITEM_WRITE_UNITS_PER_SECOND as f64,
    })
}

/// `repeats` runs at each cap in `concurrency`; medians quoted.
pub async fn map_bench(items: usize, concurrency: &[u32], repeats: usize) -> Result<MapReport, String> {
    let mut by_concurrency = Vec::new();
    for &cap in concurrency {
        let mut runs = Vec::new();
        for r in 0..repeats.max(1) {
            runs.push(map_once(items, cap, 1 + r as u64).await?);
        }
        let mut spans: Vec<f64> = runs.iter().map(|r| r.first_to_last_ms).collect();
        let mut rates: Vec<f64> = runs.iter().map(|r| r.item_calls_per_second).collect();
        by_concurrency.push(MapConcurrency {
            concurrency: cap,
            median_first_to_last_ms: median(&mut spans),
            median_item_calls_per_second: median(&mut rates),
            runs,
        });
    }
    Ok(MapReport { items, repeats: repeats.max(1), by_concurrency })
}

impl fmt::Display for MapReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "map: one order, a list step answering {} lines, then a map over them (embedded, system clock, \
             the remote answering at once); {} run(s) per cap",
            self.items, self.repeats
        )?;
        for c in &self.by_concurrency {
            writeln!(
                f,
                "  max_concurrency {}: first item call to last, median {:.1} ms; {:.0} item calls/s (median)",
                c.concurrency, c.median_first_to_last_ms, c.median_item_calls_per_second
            )?;
            for r in &c.runs {
                writeln!(
                    f,
                    "    {} item calls in {:.1} ms ({:.0}/s), run {:.1} ms, {:.1} us CPU per item; {} scheduler \
                     messages, {} write conflicts; {}",
                    r.item_calls,
                    r.first_to_last_ms,
                    r.item_calls_per_second,
                    r.run_ms,
                    r.cpu_us_per_item,
                    r.scheduler_messages,
                    r.write_conflicts,
                    if r.processed { "Processed" } else { "NOT Processed" }
                )?;
                writeln!(
                    f,
                    "    record: {} writes, the largest {} bytes (DynamoDB), {} write units in all: at least {:.1} s \
                     at one item's {} write units a second",
                    r.writes,
                    r.largest_record_bytes,
                    r.write_units,
                    r.dynamodb_floor_s,
                    ITEM_WRITE_UNITS_PER_SECOND
                )?;
            }
        }
        Ok(())
    }
}
