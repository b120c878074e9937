//! Proof that the simulation can fail: with a planted bug switched on (`sas::mutations`,
//! this crate's dev-dependency feature), the seeds must find a violation of the
//! invariant that bug breaks within a bounded number of seeds.
//!
//! The switches are process-wide, so this file is its own test binary and its tests
//! take a lock: nothing else runs while a bug is planted.

use std::sync::Mutex;

use sas::mutations::Mutation;
use sas_sim::invariants::Invariant;
use sas_sim::{run_seeds, threads};

static PLANTED: Mutex<()> = Mutex::new(());

/// Seeds the simulation may take to find a planted bug.
const WITHIN: u64 = 200;

struct Planted(Mutation);

impl Planted {
    fn on(m: Mutation) -> Planted {
        m.set(true);
        Planted(m)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Runs seeds with `mutation` on; returns the first failing seed and what it broke.
fn first_failure(mutation: Mutation) -> Option<(u64, Vec<Invariant>)> {
    let _serial = PLANTED.lock().unwrap_or_else(|p| p.into_inner());
    let summary = {
        let _planted = Planted::on(mutation);
        run_seeds(0..WITHIN, threads(), None)
    };
    assert!(!mutation.is_on());
    let caught = summary.failures.len();
    let (seed, violations) = summary.failures.into_iter().min_by_key(|(seed, _)| *seed)?;
    println!("{mutation:?}: caught by {caught} of {WITHIN} seeds, first at seed {seed}:");
    for v in &violations {
        println!("  {v}");
    }
    Some((seed, violations.iter().map(|v| v.invariant).collect()))
}

#[test]
fn disabled_fencing_is_caught() {
    let (seed, broken) = first_failure(Mutation::DisableFencing).expect("no seed caught disabled fencing");
    assert!(broken.contains(&Invariant::Fenced), "seed {seed} broke {broken:?} but not the fence");
}

#[test]
fn an_unconditional_claim_is_caught() {
    let (seed, broken) =
        first_failure(Mutation::UnconditionalClaim).expect("no seed caught unconditional claims");
    assert!(broken.contains(&Invariant::OneLease), "seed {seed} broke {broken:?} but not the one live lease");
}

/// Today's behaviour before pivots: giving up compensates whatever can be undone and
/// ends Compensated while a pivot's effect stands. The remote's ledger must show it.
#[test]
fn compensating_past_a_pivot_is_caught() {
    let (seed, broken) =
        first_failure(Mutation::CompensatePastPivot).expect("no seed caught compensation past a pivot");
    assert!(
        broken.contains(&Invariant::NothingStands),
        "seed {seed} broke {broken:?} but not nothing-stands"
    );
    assert!(
        broken.contains(&Invariant::PivotGoesForward),
        "seed {seed} broke {broken:?} but not forward-only"
    );
}

/// And with nothing planted, the same seeds pass: what the tests above catch is the bug.
#[test]
fn the_same_seeds_pass_without_a_planted_bug() {
    let _serial = PLANTED.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        [Mutation::DisableFencing, Mutation::UnconditionalClaim, Mutation::CompensatePastPivot]
            .iter()
            .all(|m| !m.is_on())
    );
    let summary = run_seeds(0..WITHIN, threads(), None);
    assert!(summary.failures.is_empty(), "{:?}", summary.failures.first());
}
