//! Chrome / Perfetto traces of a run (`meshc run --trace FILE.json`): the trace-event JSON
//! format (`{"traceEvents": [...]}`), one track per device, one complete ("X") event per
//! step — category kernel, library or collective — and one "wait" event for each span a
//! collective spent blocked for other devices, nested inside the collective's event.

use serde_json::{json, Value};

use crate::program::{Exec, Meta, Program};
use crate::runner::{device_label, StepTime};

/// Microseconds, to the nanosecond (the format's unit, without binary fractions' noise).
fn micros(d: std::time::Duration) -> f64 {
    d.as_nanos() as f64 / 1e3
}

/// The trace of one run's step times (from `Loaded::run_timed`) as JSON text.
pub fn chrome_trace(meta: &Meta, programs: &[Program], times: &[StepTime]) -> String {
    let mut events = vec![json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": meta.graph}})];
    for d in 0..programs.len() {
        let name = device_label(&meta.mesh, d);
        events.push(json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": d, "args": {"name": name}}));
    }
    let event = |name: &str, cat: &str, tid: usize, ts: f64, dur: f64| -> Value {
        json!({"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur})
    };
    for t in times {
        let step = &programs[t.device].steps[t.step];
        let cat = match step.exec {
            Exec::Kernel(_) => "kernel",
            Exec::Library(_) => "library",
            Exec::Collective(_) => "collective",
            Exec::Send(_) => "send",
            Exec::Recv(_) => "recv",
        };
        events.push(event(&step.node, cat, t.device, micros(t.start), micros(t.dur)));
        for &(start, dur) in &t.waits {
            events.push(event(&step.node, "wait", t.device, micros(start), micros(dur)));
        }
    }
    serde_json::to_string(&json!({ "traceEvents": events, "displayTimeUnit": "ms" })).expect("JSON values serialise")
}
