//! `sas-sim`: run many seeds (`SIM_SEEDS`, from `SIM_SEED_START`) and print the summary
//! and the transition coverage, or replay one (`SIM_SEED`) with its full trace, or print
//! each seed's trace hash (`SIM_HASHES`).

use std::time::Instant;

/// A run allocates for every message, record and trace line; mimalloc does that in far
/// fewer instructions than the system allocator. Nothing the simulation decides depends
/// on where memory lies, so the histories are the same (scripts/sim-fingerprint.sh).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse::<u64>().ok()) {
        let verdict =
            sas_sim::run_seed(seed, &sas_sim::Options { keep_trace: true, swarm: None, unhashed: false });
        for line in &verdict.outcome.trace {
            println!("{line}");
        }
        println!("seed {seed}: {}", verdict.outcome.swarm);
        println!("hash {:016x}", verdict.outcome.hash);
        if verdict.violations.is_empty() {
            println!("seed {seed}: every invariant held");
            return;
        }
        print!("{}", sas_sim::describe_failure(seed, &verdict.violations));
        std::process::exit(1);
    }
    let seeds = sas_sim::seeds_from_env(1_000);
    if std::env::var_os("SIM_HASHES").is_some() {
        // One line per seed, its history's hash: a refactor that changes no decision
        // leaves every line as it was (scripts/sim-fingerprint.sh).
        for seed in seeds {
            let verdict = sas_sim::run_seed(seed, &sas_sim::Options::default());
            println!(
                "seed {seed} hash {:016x} violations {}",
                verdict.outcome.hash,
                verdict.violations.len()
            );
        }
        return;
    }
    let started = Instant::now();
    let summary = sas_sim::run_seeds(seeds.clone(), sas_sim::threads(), None);
    let elapsed = started.elapsed();
    println!(
        "{} seeds in {:.1}s: {:.0} seeds/s on {} threads; {} orders, {} invocations ({} crashed), {} loop steps, {:.0} simulated minutes",
        summary.seeds,
        elapsed.as_secs_f64(),
        summary.seeds as f64 / elapsed.as_secs_f64(),
        sas_sim::threads(),
        summary.orders,
        summary.invocations,
        summary.crashes,
        summary.steps,
        summary.simulated_ms as f64 / 60_000.0
    );
    println!("final states: {:?}", summary.final_states);
    println!("faults injected: {:?}", summary.faults);
    println!("pipeline counters: {:?}", summary.metrics);
    println!("the outside party's words: {:?}", summary.outside);
    println!("parallel stages: {:?}", summary.stages);
    println!("map steps: {:?}", summary.maps);
    println!("limited agents' calls: {:?}", summary.flow);
    println!("forward calls the remote refused because their undo came first: {}", summary.late_do_refused);
    println!("longest time to end after the faults stopped: {} ms", summary.max_tail_ms);
    print!("{}", summary.coverage_table());
    for (seed, violations) in &summary.failures {
        print!("{}", sas_sim::describe_failure(*seed, violations));
    }
    if !summary.failures.is_empty() {
        std::process::exit(1);
    }
}
