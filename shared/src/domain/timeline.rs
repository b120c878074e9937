//! A task's history, kept in its record: every move with its time, step, attempt and
//! reason, and every operator action with who and why. Bounded, because the record is
//! one DynamoDB item billed per started KB on every write: at most [`TIMELINE_LEN`]
//! entries, the first (`Submitted`, how the order began) and the newest; a count says how
//! many were let go between them.
//!
//! An entry is stored as a short list (`[at, what, step, attempt]`, then `note`, `by` and
//! `step_attempt` as far as the last one there is, nulls before it) rather than a map: attribute names repeated in every entry would
//! take a single-step order's record over 1 KB, and its writes to two units each.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ids::Timestamp;
use super::lifecycle::Trigger;

/// Entries kept per task, `Submitted` among them.
pub const TIMELINE_LEN: usize = 16;
/// A note longer than this is cut; the record's `last_error` keeps the whole reason.
pub const MAX_NOTE_BYTES: usize = 160;

/// What happened: the task was accepted, or a trigger of the transition table moved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Happened {
    Submitted,
    Moved(Trigger),
}

impl Happened {
    pub fn as_str(self) -> &'static str {
        match self {
            Happened::Submitted => "Submitted",
            Happened::Moved(trigger) => trigger.as_str(),
        }
    }
}

impl std::fmt::Display for Happened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Happened {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Happened {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Happened, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "Submitted" => Ok(Happened::Submitted),
            other => Trigger::parse(other)
                .map(Happened::Moved)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown timeline entry {other:?}"))),
        }
    }
}

/// One line of a task's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub at: Timestamp,
    pub what: Happened,
    /// The step acted on (for a claim, the step claimed).
    pub step: u32,
    /// The task's attempt after the move (its claims of every step, the counter tokens,
    /// idempotency keys and the fence carry): a claim's entry carries the attempt it started.
    pub attempt: u32,
    /// The step's own attempt (its claims of the step the entry names, the record's
    /// `step_attempts`) when it differs from `attempt`: [`push`] keeps it only then, and an
    /// entry written before it was kept has none. Read it through [`Entry::step_attempt`].
    pub step_attempt: Option<u32>,
    /// Why: the reason a step failed or the task gave up, or an operator's `--reason`.
    pub note: Option<String>,
    /// Who acted, for an operator's action (the caller's identity).
    pub by: Option<String>,
}

impl Entry {
    /// The step's own attempt, what people read: `step_attempt`, or `attempt` when it is
    /// the same (or the entry is older than `step_attempt`).
    pub fn step_attempt(&self) -> u32 {
        self.step_attempt.unwrap_or(self.attempt)
    }
}

// Written by hand rather than derived through an untagged enum: serde's untagged
// deserializer buffers and retries, and its code went into every function's package.
impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // Trailing elements only as far as the last one present, nulls before it.
        let len = if self.step_attempt.is_some() {
            7
        } else if self.by.is_some() {
            6
        } else if self.note.is_some() {
            5
        } else {
            4
        };
        let mut seq = s.serialize_seq(Some(len))?;
        seq.serialize_element(&self.at)?;
        seq.serialize_element(&self.what)?;
        seq.serialize_element(&self.step)?;
        seq.serialize_element(&self.attempt)?;
        if len > 4 {
            seq.serialize_element(&self.note)?;
        }
        if len > 5 {
            seq.serialize_element(&self.by)?;
        }
        if let Some(n) = self.step_attempt {
            seq.serialize_element(&n)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Entry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a timeline entry [at, what, step, attempt, note?, by?, step_attempt?]")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Entry, A::Error> {
                use serde::de::Error;
                let missing = |n| A::Error::invalid_length(n, &self);
                let at = seq.next_element()?.ok_or_else(|| missing(0))?;
                let what = seq.next_element()?.ok_or_else(|| missing(1))?;
                let step = seq.next_element()?.ok_or_else(|| missing(2))?;
                let attempt = seq.next_element()?.ok_or_else(|| missing(3))?;
                let note = seq.next_element::<Option<String>>()?.flatten();
                let by = seq.next_element::<Option<String>>()?.flatten();
                let step_attempt = seq.next_element::<u32>()?;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(A::Error::invalid_length(8, &self));
                }
                Ok(Entry { at, what, step, attempt, step_attempt, note, by })
            }
        }
        d.deserialize_seq(Visitor)
    }
}

/// `text` cut to [`MAX_NOTE_BYTES`] on a character boundary, marked with `…` when cut.
pub fn cut_note(text: &str) -> String {
    if text.len() <= MAX_NOTE_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Appends `entry` to `entries`, letting the oldest go past [`TIMELINE_LEN`] and counting
/// them in `dropped`; the first entry stays when it is `Submitted` (a record written
/// before it was kept may have let it go), so the entries let go are those after it.
pub fn push(entries: &mut Vec<Entry>, dropped: &mut u32, mut entry: Entry) {
    entry.note = entry.note.as_deref().map(cut_note);
    entry.by = entry.by.as_deref().map(cut_note);
    entry.step_attempt = entry.step_attempt.filter(|n| *n != entry.attempt);
    entries.push(entry);
    if entries.len() > TIMELINE_LEN {
        let over = entries.len() - TIMELINE_LEN;
        let first = usize::from(entries[0].what == Happened::Submitted);
        entries.drain(first..first + over);
        *dropped = dropped.saturating_add(over as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: u64, note: Option<&str>, by: Option<&str>) -> Entry {
        Entry {
            at: Timestamp(at),
            what: Happened::Moved(Trigger::Claimed),
            step: 2,
            attempt: 3,
            step_attempt: None,
            note: note.map(str::to_owned),
            by: by.map(str::to_owned),
        }
    }

    #[test]
    fn entries_are_stored_as_short_lists_and_read_back() {
        for (e, json) in [
            (entry(5, None, None), r#"[5,"Claimed",2,3]"#),
            (entry(5, Some("no"), None), r#"[5,"Claimed",2,3,"no"]"#),
            (entry(5, Some("why"), Some("arn:me")), r#"[5,"Claimed",2,3,"why","arn:me"]"#),
            (entry(5, None, Some("arn:me")), r#"[5,"Claimed",2,3,null,"arn:me"]"#),
        ] {
            assert_eq!(serde_json::to_string(&e).unwrap(), json);
            assert_eq!(serde_json::from_str::<Entry>(json).unwrap(), e);
        }
        let second = Entry { step_attempt: Some(2), ..entry(5, None, None) };
        assert_eq!(serde_json::to_string(&second).unwrap(), r#"[5,"Claimed",2,3,null,null,2]"#);
        assert_eq!(serde_json::from_str::<Entry>(r#"[5,"Claimed",2,3,null,null,2]"#).unwrap(), second);
        assert_eq!((second.step_attempt(), entry(5, None, None).step_attempt()), (2, 3));
        let submitted = Entry { what: Happened::Submitted, ..entry(1, None, None) };
        let json = serde_json::to_string(&submitted).unwrap();
        assert_eq!(serde_json::from_str::<Entry>(&json).unwrap(), submitted);
        assert!(serde_json::from_str::<Entry>(r#"[5,"Exploded",2,3]"#).is_err());
    }

    #[test]
    fn the_timeline_keeps_submitted_and_the_newest_entries_and_counts_the_rest() {
        let submitted = Entry { what: Happened::Submitted, ..entry(0, None, None) };
        let (mut entries, mut dropped) = (vec![submitted.clone()], 0);
        for at in 1..(TIMELINE_LEN as u64 + 5) {
            push(&mut entries, &mut dropped, entry(at, None, None));
        }
        assert_eq!(entries.len(), TIMELINE_LEN);
        assert_eq!(dropped, 5);
        assert_eq!(entries[0], submitted);
        assert_eq!(entries[1].at, Timestamp(6), "entries 1-5 let go, after Submitted");
        assert_eq!(entries.last().unwrap().at, Timestamp(TIMELINE_LEN as u64 + 4));
        // A record that lost its Submitted before it was kept lets its oldest go.
        let (mut old, mut dropped) = (Vec::new(), 0);
        for at in 0..(TIMELINE_LEN as u64 + 5) {
            push(&mut old, &mut dropped, entry(at, None, None));
        }
        assert_eq!((old.len(), dropped, old[0].at), (TIMELINE_LEN, 5, Timestamp(5)));
    }

    #[test]
    fn the_steps_attempt_is_kept_only_when_it_differs_from_the_tasks() {
        let (mut entries, mut dropped) = (Vec::new(), 0);
        push(&mut entries, &mut dropped, Entry { step_attempt: Some(3), ..entry(1, None, None) });
        push(&mut entries, &mut dropped, Entry { step_attempt: Some(1), ..entry(2, None, None) });
        assert_eq!((entries[0].step_attempt, entries[1].step_attempt), (None, Some(1)));
        assert_eq!((entries[0].step_attempt(), entries[1].step_attempt()), (3, 1));
    }

    #[test]
    fn notes_are_bounded() {
        let (mut entries, mut dropped) = (Vec::new(), 0);
        let long = "é".repeat(1_000);
        push(&mut entries, &mut dropped, entry(1, Some(&long), Some(&long)));
        assert!(entries[0].note.as_ref().unwrap().len() <= MAX_NOTE_BYTES);
        assert!(entries[0].by.as_ref().unwrap().len() <= MAX_NOTE_BYTES);
        assert!(entries[0].note.as_ref().unwrap().ends_with('…'));
    }
}
