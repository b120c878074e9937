//! SchedulerMessage::parse (schedule requests and agent replies). Any input: an error,
//! never a panic; what parses serializes back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sas::domain::SchedulerMessage;

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    let Ok(message) = SchedulerMessage::parse(&body) else { return };
    let again = SchedulerMessage::parse(&message.to_body()).expect("a parsed message round-trips");
    assert_eq!(again, message);
});
