//! The conformance suite on both backends: each property once for the embedded
//! backend and once for the AWS adapters against the endpoint in SAS_TEST_ENDPOINT
//! (moto under infra/with-moto.sh). See sas_tests::conformance for the bodies.

use sas_tests::Backend;
use sas_tests::conformance as c;

macro_rules! on_both_backends {
    ($($name:ident => |$b:ident| $body:expr;)*) => {
        mod embedded {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let $b = &Backend::embedded();
                    $body.await;
                }
            )*
        }
        mod aws {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let Some(backend) = Backend::aws(stringify!($name)).await else { return };
                    let $b = &backend;
                    $body.await;
                }
            )*
        }
    };
}

on_both_backends! {
    insert_is_idempotent_and_keeps_the_first => |b| c::insert_is_idempotent_and_keeps_the_first(b);
    replace_is_conditional_and_faithful => |b| c::replace_is_conditional_and_faithful(b);
    concurrent_claimers_exactly_one_wins => |b| c::concurrent_claimers_exactly_one_wins(b, 20, 16);
    branch_replies_racing_on_one_record_all_land => |b| c::branch_replies_racing_on_one_record_all_land(b, 5);
    fenced_reply_after_expiry_is_rejected => |b| c::fenced_reply_after_expiry_is_rejected(b);
    due_returns_exactly_the_due_tasks => |b| c::due_returns_exactly_the_due_tasks(b);
    listing_reads_the_indexes => |b| c::listing_reads_the_indexes(b);
    redelivery_after_visibility_timeout => |b| c::redelivery_after_visibility_timeout(b);
    dead_letter_after_max_receives => |b| c::dead_letter_after_max_receives(b);
    a_delivery_names_its_sender => |b| c::a_delivery_names_its_sender(b);
    batches_arrive_whole_and_delays_hold => |b| c::batches_arrive_whole_and_delays_hold(b);
    unknown_queue_is_named => |b| c::unknown_queue_is_named(b);
    send_each_answers_for_every_message => |b| c::send_each_answers_for_every_message(b);
    gate_writes_are_conditional_and_faithful => |b| c::gate_writes_are_conditional_and_faithful(b);
    concurrent_arrivals_never_overfill_a_gate => |b| c::concurrent_arrivals_never_overfill_a_gate(b, 12, 3);
    one_call_mark_wins => |b| c::one_call_mark_wins(b);
}

/// The finished listing needs a table with its index, and one without to refuse it.
mod finished_listing {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn embedded() {
        c::finished_listing_reads_its_own_index(&Backend::embedded_with(true), &Backend::embedded()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn aws() {
        let Some(with) = Backend::aws_with("finished_listing", true).await else { return };
        let Some(without) = Backend::aws("finished_listing_without").await else { return };
        c::finished_listing_reads_its_own_index(&with, &without).await;
    }
}
