//! The loop's hand-made executor: one wake flag per invocation (the loop polls only what
//! was woken, so nothing runs unless the loop chose it), a poll that turns a panic into a
//! finding, and the wrapper that tells the ports which message an invocation is handling.
//! No runtime: a runtime would pick the order in which futures run, and the seed must.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use crate::world::Shared;

/// Set when an invocation's future is woken; the loop polls it and clears it.
pub struct Flag(AtomicBool);

impl Flag {
    /// A new invocation's flag: woken, so the loop polls it once at the start.
    pub fn woken() -> Arc<Flag> {
        Arc::new(Flag(AtomicBool::new(true)))
    }

    /// Whether it was woken since the last call.
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `fut` once, `flag` its waker. A panic is caught and returned as its message, so a
/// handler that panics is a finding and not the end of the run.
pub fn poll_caught<T>(
    fut: Pin<&mut (dyn Future<Output = T> + '_)>,
    flag: &Arc<Flag>,
) -> Result<Poll<T>, String> {
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(&mut cx))).map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    })
}

/// Sets the message being handled while a handler's future runs, so a store write can
/// record what it was made for.
pub struct WithMsg<F> {
    shared: Arc<Shared>,
    msg: Arc<str>,
    inner: Pin<Box<F>>,
}

struct Restore<'a>(&'a Shared, Option<Arc<str>>);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        self.0.w().current_message = self.1.take();
    }
}

impl<F: Future> Future for WithMsg<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let prev = self.shared.w().current_message.replace(self.msg.clone());
        let shared = self.shared.clone();
        let _restore = Restore(&shared, prev);
        self.inner.as_mut().poll(cx)
    }
}

pub fn with_msg<F: Future>(shared: &Arc<Shared>, body: Arc<str>, inner: F) -> WithMsg<F> {
    WithMsg { shared: shared.clone(), msg: body, inner: Box::pin(inner) }
}
