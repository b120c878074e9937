//! AgentRequest::parse. Any input: an error, never a panic; what parses serializes back
//! to itself, and its reply parses as a scheduler message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sas::domain::{AgentRequest, ReplyOutcome, SchedulerMessage};

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    let Ok(request) = AgentRequest::parse(&body) else { return };
    let again = AgentRequest::parse(&request.to_body()).expect("a parsed request round-trips");
    assert_eq!(again, request);
    let reply = SchedulerMessage::Reply(request.reply(ReplyOutcome::DONE));
    SchedulerMessage::parse(&reply.to_body()).expect("its reply parses");
});
