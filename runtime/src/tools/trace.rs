//! Chrome / Perfetto traces of a run (`meshc run --trace FILE.json`): the trace-event JSON
//! format (`{"traceEvents": [...]}`), one track per device and stream, one complete ("X")
//! event per step — category kernel, library or collective — and one "wait" event for each
//! span a collective spent blocked for other devices (nested inside the collective's event)
//! or a step spent waiting for an event of another stream (just before the step's event).

use serde_json::{json, Value};

use crate::exec::shared::StepTime;
use crate::format::program::{Exec, Meta, Program, StreamKind};

/// Microseconds, to the nanosecond (the format's unit, without binary fractions' noise).
fn micros(d: std::time::Duration) -> f64 {
    d.as_nanos() as f64 / 1e3
}

/// The trace of one run's step times (from `Loaded::run_timed`) as JSON text.
pub fn chrome_trace(meta: &Meta, programs: &[Program], times: &[StepTime]) -> String {
    let mut events = vec![json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": meta.graph}})];
    // One track per device and stream that runs something, a device's streams next to each
    // other; a device that runs everything on its main stream is just the device.
    let used = |p: &Program| {
        let s = &p.streams.streams;
        (0..s.len()).filter(|&k| k == 0 || !s[k].steps.is_empty()).collect::<Vec<usize>>()
    };
    let per = programs.iter().map(|p| used(p).last().map_or(1, |&k| k + 1)).max().unwrap_or(1);
    let tid = |device: usize, stream: usize| device * per + stream;
    for (d, p) in programs.iter().enumerate() {
        let name = meta.mesh.device_label(d);
        let used = used(p);
        if used.len() <= 1 {
            events.push(json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid(d, 0), "args": {"name": name}}));
            continue;
        }
        for k in used {
            let kind = match p.streams.streams[k].kind {
                StreamKind::Compute => "compute",
                StreamKind::Comm => "comm",
            };
            let name = format!("{name} s{k} {kind}");
            events.push(json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid(d, k), "args": {"name": name}}));
        }
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
        let tid = tid(t.device, t.stream);
        events.push(event(&step.node, cat, tid, micros(t.start), micros(t.dur)));
        for &(start, dur) in &t.waits {
            events.push(event(&step.node, "wait", tid, micros(start), micros(dur)));
        }
    }
    serde_json::to_string(&json!({ "traceEvents": events, "displayTimeUnit": "ms" })).expect("JSON values serialise")
}
