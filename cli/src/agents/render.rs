//! How `sasctl agents` prints a limited agent's gate: a table row and a JSON object per
//! agent for `list`, and the places, line and pause for `show`.
//!
//! Nothing here reads the clock or the deployment: the caller passes what it read and
//! `now`. Places whose time has passed are not counted: the gate's next write drops them
//! (`Gate::moved`), and until then they hold nothing back.

use sas::domain::Timestamp;
use sas::domain::gate::{Gate, Limits, RESERVATION_MS};
use serde_json::{Value, json};

use crate::tasks::render::{iso, one_line};

/// What was read of one limited agent.
#[derive(Debug, Clone)]
pub struct Seen {
    pub agent: String,
    pub limits: Limits,
    /// Its gates that were ever written (none: nothing ever waited or held a place). An
    /// agent's places spread over several gates past 10 (`Limits::gates`): what they hold
    /// is shown added up.
    pub gates: Vec<Gate>,
    /// The task holding the lowest waiting ticket, when its waiter note and its record
    /// agree on it.
    pub first: Option<FirstInLine>,
}

/// The task first in the agent's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstInLine {
    pub ticket: u64,
    pub order_id: String,
    /// When the task came to the gate for its step (`Ticket::since`).
    pub since: Timestamp,
}

/// Who holds a place, read back from the holder string the scheduler writes
/// (`sas::domain::gate::call_holder`, `reserved_for`; a test holds the two together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    Call {
        order_id: String,
        attempt: u32,
        lease: String,
    },
    Reserved {
        ticket: u64,
    },
    /// A holder in no form this sasctl knows: shown as it is.
    Other(String),
}

impl Holder {
    pub fn parse(holder: &str) -> Holder {
        // Order ids never hold '#', so the last one splits the order from the rest.
        let other = || Holder::Other(holder.to_owned());
        let Some((order, rest)) = holder.rsplit_once('#') else { return other() };
        if order.is_empty() {
            return rest.parse().map_or_else(|_| other(), |ticket| Holder::Reserved { ticket });
        }
        match rest.split_once('.').map(|(a, l)| (a.parse::<u32>(), l)) {
            Some((Ok(attempt), lease)) => {
                Holder::Call { order_id: order.to_owned(), attempt, lease: lease.to_owned() }
            }
            _ => other(),
        }
    }
}

/// The gates as they stand at `now`: places still held, what waits, and a pause still on
/// (the latest, where several gates were paused).
struct Now<'a> {
    holds: Vec<(Holder, Timestamp)>,
    /// Places given back in the last window that still count against `max_per_second`.
    tails: usize,
    waiting: u64,
    paused_until: Option<Timestamp>,
    /// The agent's one gate, when one holds all its places and it was written.
    gate: Option<&'a Gate>,
    /// How many gates hold its places, and how many of them were written.
    spread: u32,
    written: usize,
}

fn at(seen: &Seen, now: Timestamp) -> Now<'_> {
    let gates = &seen.gates;
    let spread = seen.limits.gates();
    Now {
        holds: gates
            .iter()
            .flat_map(|g| {
                g.holds.iter().filter(|h| h.until > now).map(|h| (Holder::parse(&h.holder), h.until))
            })
            .collect(),
        tails: gates.iter().map(|g| g.tails.iter().filter(|t| **t > now).count()).sum(),
        waiting: gates.iter().map(Gate::waiting).sum(),
        paused_until: gates.iter().filter_map(|g| g.paused_until).filter(|p| *p > now).max(),
        gate: gates.first().filter(|_| spread == 1),
        spread,
        written: gates.len(),
    }
}

impl Now<'_> {
    fn reserved(&self) -> usize {
        self.holds.iter().filter(|(h, _)| matches!(h, Holder::Reserved { .. })).count()
    }
}

fn limit(l: Option<u32>) -> String {
    l.map_or_else(|| "-".to_owned(), |l| l.to_string())
}

fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1_000.0)
}

/// `agents list`'s table: one row per agent, its limits and its gate at `now`.
pub fn list_text(agents: &[Seen], now: Timestamp) -> String {
    let mut rows = vec![
        ["AGENT", "MAX IN FLIGHT", "MAX PER SECOND", "HELD", "WAITING", "PAUSED"].map(str::to_owned).to_vec(),
    ];
    for seen in agents {
        let n = at(seen, now);
        rows.push(vec![
            seen.agent.clone(),
            limit(seen.limits.max_in_flight),
            limit(seen.limits.max_per_second),
            n.holds.len().to_string(),
            n.waiting.to_string(),
            n.paused_until.map_or_else(|| "-".to_owned(), |p| format!("paused until {}", iso(p))),
        ]);
    }
    crate::text::columns(&rows, "")
}

/// One agent of `agents list --json`.
pub fn list_json(seen: &Seen, now: Timestamp) -> Value {
    let n = at(seen, now);
    json!({
        "agent": seen.agent,
        "max_in_flight": seen.limits.max_in_flight,
        "max_per_second": seen.limits.max_per_second,
        "held": n.holds.len(),
        "reserved": n.reserved(),
        "waiting": n.waiting,
        "paused_until": n.paused_until.map(iso),
    })
}

/// `agents show`: limits, places, line and pause, one field a line, then each place held.
/// `next`: command lines to paste.
pub fn show_text(seen: &Seen, now: Timestamp, next: &[String]) -> String {
    let n = at(seen, now);
    let mut fields: Vec<(&str, String)> = vec![
        ("agent", seen.agent.clone()),
        ("max_in_flight", limit(seen.limits.max_in_flight)),
        ("max_per_second", limit(seen.limits.max_per_second)),
    ];
    let calls = n.holds.len() - n.reserved();
    let of = seen.limits.max_in_flight.map_or_else(String::new, |m| format!(" of {m}"));
    fields.push(("held", format!("{}{of} ({calls} in calls, {} reserved)", n.holds.len(), n.reserved())));
    if let Some(m) = seen.limits.max_per_second {
        fields.push((
            "this second",
            format!(
                "{} of {m} (places held, and given back less than a second ago)",
                n.holds.len() + n.tails
            ),
        ));
    }
    fields.push(("waiting", waiting_line(&n)));
    if let Some(first) = &seen.first {
        fields.push((
            "first in line",
            format!(
                "ticket {}, task {}, waiting since {} ({})",
                first.ticket,
                first.order_id,
                iso(first.since),
                seconds(now.millis_since(first.since))
            ),
        ));
    }
    fields.push((
        "paused",
        n.paused_until.map_or_else(
            || "no".to_owned(),
            |p| format!("paused until {} (the service answered with Retry-After)", iso(p)),
        ),
    ));
    if let Some(look) = n.gate.and_then(|g| g.poke_at).filter(|p| *p > now) {
        fields.push(("next look", iso(look)));
    }
    if n.spread > 1 {
        fields.push((
            "gates",
            format!("{} ({} written), each holding its share of the limits", n.spread, n.written),
        ));
    } else if n.gate.is_none() {
        fields.push(("gate", "never written: nothing has waited or held a place yet".to_owned()));
    }
    let mut out = String::new();
    for (k, v) in &fields {
        out.push_str(&format!("{k:<16}{v}\n"));
    }
    if !n.holds.is_empty() {
        out.push_str("\nplaces held:\n");
        let mut rows = vec![["HOLDER", "TASK", "ATTEMPT", "SINCE", "UNTIL"].map(str::to_owned).to_vec()];
        for (holder, until) in &n.holds {
            rows.push(match holder {
                Holder::Call { order_id, attempt, lease } => vec![
                    format!("call (lease {lease})"),
                    order_id.clone(),
                    attempt.to_string(),
                    "-".to_owned(),
                    iso(*until),
                ],
                Holder::Reserved { ticket } => vec![
                    format!("reserved for ticket {ticket}"),
                    "-".to_owned(),
                    "-".to_owned(),
                    iso(Timestamp(until.0.saturating_sub(RESERVATION_MS))),
                    iso(*until),
                ],
                Holder::Other(raw) => {
                    vec![one_line(raw, 60), "-".to_owned(), "-".to_owned(), "-".to_owned(), iso(*until)]
                }
            });
        }
        out.push_str(&crate::text::columns(&rows, "  "));
    }
    if !next.is_empty() {
        out.push_str("\nnext:\n");
        for line in next {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

fn waiting_line(n: &Now<'_>) -> String {
    match n.gate {
        Some(g) if n.waiting > 0 => {
            let skipped = if g.withdrawn.is_empty() {
                String::new()
            } else {
                format!(", {} withdrawn to skip", g.withdrawn.len())
            };
            format!("{} ticket(s), tickets {} to {}{skipped}", n.waiting, g.admitted, g.issued - 1)
        }
        _ if n.waiting > 0 => format!("{} ticket(s) over {} gates", n.waiting, n.spread),
        _ => "0 ticket(s)".to_owned(),
    }
}

/// `agents show --json`.
pub fn show_json(seen: &Seen, now: Timestamp, next: &[String]) -> Value {
    let n = at(seen, now);
    let mut calls = Vec::new();
    let mut reserved = Vec::new();
    let mut other = Vec::new();
    for (holder, until) in &n.holds {
        match holder {
            Holder::Call { order_id, attempt, lease } => calls.push(
                json!({"order_id": order_id, "attempt": attempt, "lease": lease, "until": iso(*until)}),
            ),
            Holder::Reserved { ticket } => reserved.push(json!({
                "ticket": ticket,
                "since": iso(Timestamp(until.0.saturating_sub(RESERVATION_MS))),
                "until": iso(*until),
            })),
            Holder::Other(raw) => other.push(json!({"holder": raw, "until": iso(*until)})),
        }
    }
    let mut v = list_json(seen, now);
    v["gate_written"] = json!(n.written > 0);
    v["gates"] = json!(n.spread);
    v["calls"] = json!(calls);
    v["reserved_places"] = json!(reserved);
    if !other.is_empty() {
        v["other_holders"] = json!(other);
    }
    if seen.limits.max_per_second.is_some() {
        v["this_second"] = json!(n.holds.len() + n.tails);
    }
    if let Some(g) = n.gate {
        v["tickets"] = json!({"issued": g.issued, "admitted": g.admitted, "withdrawn": g.withdrawn});
        v["next_look"] = json!(g.poke_at.filter(|p| *p > now).map(iso));
    }
    v["first_in_line"] = json!(seen.first.as_ref().map(|f| json!({
        "ticket": f.ticket,
        "order_id": f.order_id,
        "since": iso(f.since),
        "waited_ms": now.millis_since(f.since),
    })));
    v["next"] = json!(next);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::gate::{call_holder, reserved_for};
    use sas::domain::{LeaseToken, OrderId};

    const T0: u64 = 1_700_000_000_000;

    fn t(ms: u64) -> Timestamp {
        Timestamp(T0 + ms)
    }

    const TWO: Limits =
        Limits { max_in_flight: Some(2), max_per_second: None, places_per_gate: None, per_key: None };

    /// payment, two places: o-1's call holds one, then o-1's call is over and ticket 0 is
    /// let through (a reserved place); tickets 1 and 2 wait. Made by the domain's own
    /// decisions, as the scheduler writes it.
    fn busy() -> Gate {
        let lease = LeaseToken(uuid::Uuid::from_u128(0xabcd_ef01_0000_0000_0000_0000_0000_0000));
        let a = call_holder(&OrderId::parse("o-1").unwrap(), 3, &lease);
        let b = call_holder(&OrderId::parse("o-2").unwrap(), 1, &lease);
        let g = Gate::new("payment").arrive(t(0), &TWO, &a, t(60_000), None).next;
        let g = g.arrive(t(1), &TWO, &b, t(60_000), None).next;
        let g = g.arrive(t(2), &TWO, "o-3#1.00000000", t(60_000), None).next;
        let g = g.arrive(t(3), &TWO, "o-4#1.00000000", t(60_000), None).next;
        let g = g.arrive(t(4), &TWO, "o-5#1.00000000", t(60_000), None).next;
        g.release(t(1_000), &TWO, &a).next
    }

    fn seen(gate: Option<Gate>) -> Seen {
        Seen { agent: "payment".into(), limits: TWO, gates: gate.into_iter().collect(), first: None }
    }

    #[test]
    fn holders_read_back_as_the_scheduler_writes_them() {
        let lease = LeaseToken(uuid::Uuid::from_u128(0x1a2b_3c4d_0000_0000_0000_0000_0000_0000));
        let call = call_holder(&OrderId::parse("o_7-x").unwrap(), 12, &lease);
        assert_eq!(
            Holder::parse(&call),
            Holder::Call { order_id: "o_7-x".into(), attempt: 12, lease: "1a2b3c4d".into() }
        );
        assert_eq!(Holder::parse(&reserved_for(41)), Holder::Reserved { ticket: 41 });
        for odd in ["", "#x", "o-1#", "o-1#x.1", "plain"] {
            assert_eq!(Holder::parse(odd), Holder::Other(odd.into()), "{odd:?}");
        }
    }

    #[test]
    fn the_list_gives_limits_places_held_tickets_waiting_and_a_pause() {
        let paused = busy().pause(t(1_000), t(31_000));
        let table = list_text(&[seen(Some(paused.clone()))], t(2_000));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "AGENT    MAX IN FLIGHT  MAX PER SECOND  HELD  WAITING  PAUSED");
        assert_eq!(
            lines[1],
            "payment  2              -               2     2        paused until 2023-11-14T22:13:51.000Z"
        );
        let v = list_json(&seen(Some(paused)), t(2_000));
        assert_eq!(
            v,
            json!({"agent": "payment", "max_in_flight": 2, "max_per_second": null, "held": 2,
                   "reserved": 1, "waiting": 2, "paused_until": "2023-11-14T22:13:51.000Z"})
        );
        // Once the pause and the places' times have passed, they no longer count.
        let later = list_json(&seen(Some(busy().pause(t(1_000), t(31_000)))), t(120_000));
        assert_eq!((later["held"].clone(), later["paused_until"].clone()), (json!(0), Value::Null));
    }

    #[test]
    fn a_gate_never_written_is_nothing_held_and_nobody_waiting() {
        let row = list_text(&[seen(None)], t(0));
        assert!(
            row.lines()
                .nth(1)
                .unwrap()
                .starts_with("payment  2              -               0     0        -")
        );
        let v = show_json(&seen(None), t(0), &[]);
        assert_eq!((v["held"].clone(), v["waiting"].clone()), (json!(0), json!(0)));
        assert_eq!(v["gate_written"], json!(false));
        assert!(show_text(&seen(None), t(0), &[]).contains("never written"));
    }

    #[test]
    fn show_names_each_holder_the_reserved_places_and_the_first_in_line() {
        let mut s = seen(Some(busy()));
        s.first = Some(FirstInLine { ticket: 1, order_id: "o-4".into(), since: t(3) });
        let next = vec!["sasctl tasks list --state queued --agent payment".to_owned()];
        let text = show_text(&s, t(2_503), &next);
        for want in [
            "max_in_flight   2\n",
            "held            2 of 2 (1 in calls, 1 reserved)\n",
            "waiting         2 ticket(s), tickets 1 to 2\n",
            "first in line   ticket 1, task o-4, waiting since 2023-11-14T22:13:20.003Z (2.5 s)\n",
            "paused          no\n",
            "  call (lease abcdef01)  o-2   1        -                         2023-11-14T22:14:20.000Z\n",
            "  reserved for ticket 0  -     -        2023-11-14T22:13:21.000Z  2023-11-14T22:13:31.000Z\n",
            "next:\n  sasctl tasks list --state queued --agent payment\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let v = show_json(&s, t(2_503), &next);
        assert_eq!(
            v["calls"],
            json!([{"order_id": "o-2", "attempt": 1, "lease": "abcdef01", "until": "2023-11-14T22:14:20.000Z"}])
        );
        assert_eq!(
            v["reserved_places"],
            json!([{"ticket": 0, "since": "2023-11-14T22:13:21.000Z", "until": "2023-11-14T22:13:31.000Z"}])
        );
        assert_eq!(v["first_in_line"]["waited_ms"], json!(2_500));
        assert_eq!(v["tickets"], json!({"issued": 3, "admitted": 1, "withdrawn": []}));
        assert_eq!(v["waiting"], json!(2));
        assert_eq!(v["next"], json!(next));
        assert!(v.get("this_second").is_none(), "no rate limit, no rate window");
    }

    #[test]
    fn under_a_rate_limit_show_counts_the_places_given_back_this_second() {
        let rate =
            Limits { max_in_flight: None, max_per_second: Some(5), places_per_gate: None, per_key: None };
        let g = Gate::new("wms").arrive(t(0), &rate, "o-1#1.00000000", t(60_000), None).next;
        let g = g.arrive(t(1), &rate, "o-2#1.00000000", t(60_000), None).next;
        let g = g.release(t(100), &rate, "o-1#1.00000000").next;
        let s = Seen { agent: "wms".into(), limits: rate, gates: vec![g], first: None };
        assert!(
            show_text(&s, t(500), &[]).contains("this second     2 of 5 ("),
            "{}",
            show_text(&s, t(500), &[])
        );
        assert_eq!(show_json(&s, t(500), &[])["this_second"], json!(2));
        assert_eq!(show_json(&s, t(1_500), &[])["this_second"], json!(1), "the tail ends a second after");
    }

    #[test]
    fn places_spread_over_gates_are_shown_added_up() {
        let twenty =
            Limits { max_in_flight: Some(20), max_per_second: None, places_per_gate: None, per_key: None };
        assert_eq!(twenty.gates(), 2);
        let gate = |name: &str, holders: &[&str]| {
            holders.iter().fold(Gate::new(name), |g, h| g.arrive(t(0), &TWO, h, t(60_000), None).next)
        };
        let s = Seen {
            agent: "payment".into(),
            limits: twenty,
            gates: vec![
                gate("payment@0", &["o-1#1.00000000", "o-2#1.00000000", "o-3#1.00000000"]),
                gate("payment@1", &["o-4#1.00000000"]),
            ],
            first: None,
        };
        let v = show_json(&s, t(1_000), &[]);
        assert_eq!(
            (v["held"].clone(), v["waiting"].clone(), v["gates"].clone()),
            (json!(3), json!(1), json!(2))
        );
        let text = show_text(&s, t(1_000), &[]);
        for want in [
            "held            3 of 20 (3 in calls, 0 reserved)\n",
            "waiting         1 ticket(s) over 2 gates\n",
            "gates           2 (2 written)",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
    }
}
