//! What the orders queue's handler parses: `Intake::parse` (an order or an app's cancel),
//! OrderRequest::parse, then validate, then the canonical payload; and the best-effort
//! sniffers the submission uses on bodies it rejects. Any input: an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sas::domain::{Intake, OrderRequest, Workflows, sniff_order_id, sniff_reply_to};

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    let _ = sniff_order_id(&body);
    let _ = sniff_reply_to(&body);
    // A cancel serializes back to itself through the same parser.
    if let Ok(Intake::Cancel(cancel)) = Intake::parse(&body) {
        let again = serde_json::to_string(&cancel).expect("a cancel serializes");
        assert_eq!(Intake::parse(&again).ok(), Some(Intake::Cancel(cancel)));
    }
    let Ok(request) = OrderRequest::parse(&body) else { return };
    let Ok((order, _reply_to)) = request.validate(&Workflows::builtin()) else { return };
    // A valid order's canonical payload parses back to the same order.
    let payload = order.payload();
    let again: sas::domain::Order = serde_json::from_str(&payload).expect("the payload of a valid order parses");
    assert_eq!(again, order);
});
