//! `cargo bench --bench sendrecv`: point-to-point transfers and pipelining (issue 5).
//! - The rendezvous (`meshc_runtime::comm::exchange`) between two device threads: one-way latency of a
//!   4-byte transfer (ping-pong, half the round trip) and throughput of a 64 MiB transfer,
//!   for both protocols, against a 64 MiB memcpy on one thread.
//! - A transformer block (batch 32, seq 32, embed 256, 8 heads, hidden 1024; the structure of
//!   testdata/transformer) on one device, cut by the auto placer into 4 stages of one device
//!   each without micro-batches, and with 8 micro-batches (GPipe). End-to-end, in memory, N
//!   rounds in which the three run in turn (`SENDRECV_BENCH_RUNS`, default 30: a loaded
//!   machine slows them alike), min and median each, and the cores each kept busy (CPU time
//!   over wall time: where the 1-device run, whose GEMMs use every core, gets no more than
//!   one, the machine had no second core to give a pipeline either), all in this one run;
//!   the pipelined results are checked against the one-device result.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{cpu_seconds, median, transformer, transformer_inputs};
use meshc::compile::{Compiled, Options};
use meshc::driver;
use meshc::layout;
use meshc::pipeline::Dumps;
use meshc_ir::{params, text, verify, Tensor};
use meshc_runtime::comm::exchange::Exchange;
use meshc_runtime::exec::runner::{AlignedBuf, Loaded};
use meshc_runtime::format::program::{Protocol, Transfer};

fn transfer(key: &str, peer: usize, bytes: usize, protocol: Protocol) -> Transfer {
    Transfer { key: key.into(), peer, bytes, protocol }
}

/// Median one-way latency of a 4-byte transfer: device 0 sends "ping" k, device 1 answers
/// "pong" k; half of a round trip.
fn latency(protocol: Protocol, rounds: usize) -> f64 {
    let ex = Exchange::default();
    ex.set_timeout(Duration::from_secs(10));
    let (a, b) = (AlignedBuf::zeroed(64).unwrap(), AlignedBuf::zeroed(64).unwrap());
    let (pa, pb) = (a.as_slice().as_ptr() as usize, b.as_slice().as_ptr() as usize);
    let mut samples = Vec::new();
    for batch in 0..5 {
        ex.reset();
        let keys: Vec<(String, String)> =
            (0..rounds).map(|k| (format!("ping{batch}.{k}"), format!("pong{batch}.{k}"))).collect();
        let start = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                for (ping, pong) in &keys {
                    // SAFETY: 64-byte buffers, 4 bytes moved; move sends keep `a` untouched.
                    unsafe {
                        ex.recv(1, &transfer(ping, 0, 4, protocol), pb as *mut u8).unwrap();
                        ex.send(1, &transfer(pong, 0, 4, protocol), pb as *const u8).unwrap();
                    }
                }
            });
            for (ping, pong) in &keys {
                // SAFETY: as above.
                unsafe {
                    ex.send(0, &transfer(ping, 1, 4, protocol), pa as *const u8).unwrap();
                    ex.recv(0, &transfer(pong, 1, 4, protocol), pa as *mut u8).unwrap();
                }
            }
        });
        samples.push(start.elapsed().as_secs_f64() / (2 * rounds) as f64);
    }
    median(samples)
}

/// Min and median seconds of one transfer of `bytes` from device 0 to device 1 (from the
/// send's start until the recv returns; the min shows the cost without the scheduling
/// delays a loaded machine adds).
fn bulk(protocol: Protocol, bytes: usize, runs: usize) -> (f64, f64) {
    let ex = Exchange::default();
    let src = AlignedBuf::from_bytes(&vec![1u8; bytes]).unwrap();
    let mut dst = AlignedBuf::zeroed(bytes).unwrap();
    let (ps, pd) = (src.as_slice().as_ptr() as usize, dst.as_mut_slice().as_mut_ptr() as usize);
    let samples = (0..runs)
        .map(|k| {
            let key = format!("bulk{k}");
            let start = Instant::now();
            std::thread::scope(|s| {
                s.spawn(|| {
                    // SAFETY: both buffers hold `bytes`; nothing else touches them meanwhile.
                    unsafe { ex.send(0, &transfer(&key, 1, bytes, protocol), ps as *const u8).unwrap() };
                });
                // SAFETY: as above.
                let at = unsafe { ex.recv(1, &transfer(&key, 0, bytes, protocol), pd as *mut u8).unwrap() };
                // SAFETY: `at` holds the bytes sent.
                assert_eq!(unsafe { *at.add(bytes - 1) }, 1);
            });
            start.elapsed().as_secs_f64()
        })
        .collect::<Vec<f64>>();
    (samples.iter().copied().fold(f64::INFINITY, f64::min), median(samples))
}

fn memcpy(bytes: usize, runs: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&dst);
                start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

const B: usize = 32;
const S: usize = 32;
const E: usize = 256;
const HEADS: usize = 8;
const HIDDEN: usize = 1024;
const VOCAB: usize = 100;

fn graph() -> String {
    transformer(B, S, E, HEADS, HIDDEN, VOCAB)
}

fn build(spec: Option<&str>) -> Compiled {
    let g = text::parse(&graph()).expect("bench graph parses");
    let info = verify::verify(&g).expect("bench graph verifies");
    let values = params::load_all(&g, std::path::Path::new(".")).expect("init params");
    let spec = spec.map(|s| layout::parse(s, "bench-spec").expect("bench spec parses"));
    driver::Job::new(&g, &info, &values, &Options::default())
        .spec(spec.as_ref())
        .build(&Dumps::default())
        .expect("compiles")
}

fn inputs() -> HashMap<String, Tensor> {
    transformer_inputs(&text::parse(&graph()).expect("bench graph parses"))
}

/// A compiled program's timings: min and median seconds of a run, the cores it kept busy
/// on average (CPU time over wall time), and its output.
struct Timed {
    min: f64,
    median: f64,
    cores: f64,
    y: Tensor,
}

/// Runs the compiled programs in turn, `runs` rounds (so that a loaded machine slows all
/// of them alike).
fn time_alternating(cs: Vec<Compiled>, runs: usize) -> Vec<Timed> {
    let loaded: Vec<Loaded> = cs.into_iter().map(|c| c.load().unwrap()).collect();
    let x = inputs();
    let mut outs: Vec<Tensor> = loaded.iter().map(|l| l.run(&x).unwrap().remove("y").unwrap()).collect();
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); loaded.len()];
    let mut cpu = vec![0.0; loaded.len()];
    for _ in 0..runs {
        for (k, l) in loaded.iter().enumerate() {
            let c = cpu_seconds();
            let s = Instant::now();
            outs[k] = l.run(&x).unwrap().remove("y").unwrap();
            t[k].push(s.elapsed().as_secs_f64());
            cpu[k] += cpu_seconds() - c;
        }
    }
    (t.into_iter().zip(outs).zip(cpu))
        .map(|((t, y), cpu)| Timed {
            min: t.iter().copied().fold(f64::INFINITY, f64::min),
            cores: cpu / t.iter().sum::<f64>(),
            median: median(t),
            y,
        })
        .collect()
}

fn spec(microbatches: usize) -> String {
    format!(
        r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [4], "axes": ["stage"]}},
            "placement": {{"auto": {{"stages": 4}}, "microbatches": {microbatches}}}}}"#
    )
}

fn main() {
    let runs = std::env::var("SENDRECV_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    println!("\n## send/recv between two device threads (medians)");
    for protocol in [Protocol::Copy, Protocol::Move] {
        println!("4 B latency, {:<4}     {:8.2} µs one way", protocol.name(), latency(protocol, 2000) * 1e6);
    }
    let mib = 64 << 20;
    let (copy_min, copy) = bulk(Protocol::Copy, mib, 20);
    let (moved_min, moved) = bulk(Protocol::Move, mib, 20);
    let mc = memcpy(mib, 20);
    println!(
        "64 MiB, copy          {:8.2} ms  {:6.2} GB/s   (min {:.2} ms, {:.2} GB/s)",
        copy * 1e3,
        mib as f64 / copy / 1e9,
        copy_min * 1e3,
        mib as f64 / copy_min / 1e9
    );
    println!(
        "64 MiB, move          {:8.3} ms  (min {:.3} ms: hands the buffer over, no copy)",
        moved * 1e3,
        moved_min * 1e3
    );
    println!("64 MiB memcpy, 1 thread {:6.2} ms  {:6.2} GB/s", mc * 1e3, mib as f64 / mc / 1e9);

    println!(
        "\n## transformer block [{B}x{S}x{E}], hidden {HIDDEN}: pipeline over 4 devices, {runs} alternating rounds"
    );
    let r = time_alternating(vec![build(None), build(Some(&spec(1))), build(Some(&spec(8)))], runs);
    let names = ["1 device", "4 stages, no micro-batches", "4 stages, 8 micro-batches"];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (t, name) in r.iter().zip(names) {
        println!(
            "{name:<28} min {:7.3} ms  median {:7.3} ms  ({:.2}x the 1-device median)  cores busy {:.2} of {cores}",
            t.min * 1e3,
            t.median * 1e3,
            r[0].median / t.median,
            t.cores
        );
    }
    println!(
        "8 micro-batches vs none: {:.2}x (medians), {:.2}x (mins)",
        r[1].median / r[2].median,
        r[1].min / r[2].min
    );
    for (what, t) in [("4 stages", &r[1]), ("4 stages x 8 micro-batches", &r[2])] {
        let c = t.y.closeness(&r[0].y);
        assert!(c.first_bad.is_none(), "{what}: the result differs from the 1-device result: {c:?}");
    }
    println!("pipelined vs 1-device result: equal within tolerance");
}
