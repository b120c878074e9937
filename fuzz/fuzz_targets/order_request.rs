//! OrderRequest::parse, then validate, then the canonical payload; and the best-effort
//! sniffers the submission uses on bodies it rejects. Any input: an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sas::domain::{OrderRequest, Workflows, sniff_order_id, sniff_reply_to};

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    let _ = sniff_order_id(&body);
    let _ = sniff_reply_to(&body);
    let Ok(request) = OrderRequest::parse(&body) else { return };
    let Ok((order, _reply_to)) = request.validate(&Workflows::builtin()) else { return };
    // A valid order's canonical payload parses back to the same order.
    let payload = order.payload();
    let again: sas::domain::Order = serde_json::from_str(&payload).expect("the payload of a valid order parses");
    assert_eq!(again, order);
});
