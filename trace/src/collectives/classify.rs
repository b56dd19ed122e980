//! Which collective an event, op or kernel name denotes, across frameworks
//! and versions: XLA HLO ops (`all-reduce.3`, `all-gather-start`), XLA GPU
//! thunks (`NcclAllReduceStartThunk`, `AllReduceStartThunk`), JAX
//! primitives (`psum`, `jit(step)/ppermute`), PyTorch c10d ops
//! (`c10d::allreduce_`, `_c10d_functional::all_gather_into_tensor`), the
//! process-group backends' spans (`gloo:all_reduce`, `nccl:_all_gather_base`,
//! `nccl:send 0->1`), the `record_param_comms` collective name
//! ([`classify_comms_arg`]) and NCCL/RCCL kernels
//! (`ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`,
//! `ncclKernel_AllReduce_RING_LL_Sum_float`, `ncclAllReduceRingLLKernel_sum_f32`).
//!
//! One table (`STEMS`) names every collective; the forms above only
//! decide how a name is cut down to a stem and whether an *ambiguous* stem
//! may match. Ambiguous stems (`broadcast`, `reduce`, `gather`, `scatter`,
//! `send`, `recv`, `barrier`) are also ordinary compute ops (XLA
//! `broadcast`/`reduce`/`gather`/`scatter`, `aten::gather`) or host
//! transfers (XLA `send`/`recv` to the host), so they count only inside a
//! communication namespace: `c10d::`, a backend prefix (`gloo:`), an NCCL
//! kernel or NVTX name, an `Nccl…Thunk`, or a `record_param_comms` arg.
//!
//! What a name cannot tell: `ncclDevKernel_Generic*` (RCCL, and NCCL builds
//! without a specialised kernel) and XLA `async-start`/`CollectiveDoneThunk`
//! carry no kind; the parser takes it from the correlated host-side op.
//! Which *layer* to match is also the parser's call: one PyTorch NCCL call
//! shows up as `c10d::allreduce_`, `record_param_comms`, `nccl:all_reduce`
//! and a kernel. The NCCL host spans only enqueue work (they return before
//! the peers arrive), so enter/exit that can be compared across ranks come
//! from the kernel; gloo spans are synchronous and can be used as they are.

use super::model::CollectiveKind;

/// Which part of a collective a name marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The whole collective (a synchronous op, a kernel, a host span).
    Whole,
    /// The start of an asynchronous pair (`all-reduce-start`,
    /// `AllReduceStartThunk`): the call enters here.
    Start,
    /// The end of an asynchronous pair (`all-reduce-done`): not a new
    /// collective; the parser pairs it with its start for the exit.
    Done,
}

/// A recognised collective name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Classified {
    pub kind: CollectiveKind,
    pub phase: Phase,
}

/// The collective a name starts, or `None` for a non-collective and for the
/// `-done` half of an asynchronous pair (see [`classify_name`] for it).
pub fn classify(name: &str) -> Option<CollectiveKind> {
    classify_name(name)
        .filter(|c| c.phase != Phase::Done)
        .map(|c| c.kind)
}

/// A `record_param_comms` "Collective name" arg (`allreduce`,
/// `_allgather_base`, `reduce_scatter_tensor`, `broadcast`, `recv`…): the
/// op is known to be communication, so ambiguous stems count.
pub fn classify_comms_arg(value: &str) -> Option<CollectiveKind> {
    stem_match(&canonical(value.trim()), true, false).map(|c| c.kind)
}

/// The collective and phase a name marks, `-done` halves included.
pub fn classify_name(name: &str) -> Option<Classified> {
    let name = name.trim();
    let name = name.strip_prefix("void ").unwrap_or(name).trim_start();
    if name.starts_with("nccl") && name.contains("Kernel") {
        return nccl_kernel(name);
    }
    // `jit(step)/jit(main)/psum`: the op is the last path segment. Python
    // frames (`torch/distributed/distributed_c10d.py(2050): all_reduce`)
    // then cut down to a file name and match nothing, as they should.
    let name = name.rsplit('/').next().unwrap_or(name);
    // Arguments, HLO shapes and params: `nccl:send 0->1`,
    // `%all-reduce.3 = f32[8]`, `psum[axes=('i',)]`.
    let name = name.split(['(', '[', '{', ' ', '=']).next().unwrap_or(name);
    let name = name.strip_prefix('%').unwrap_or(name);
    if let Some((ns, op)) = name.rsplit_once("::") {
        // Only c10d's namespaces (`c10d`, `_c10d_functional`,
        // `c10d_functional`, `_c10d_functional_autograd`): `aten::all`,
        // `aten::gather` are compute.
        return if ns.to_ascii_lowercase().contains("c10d") {
            whole(stem_match(&canonical(op), true, false))
        } else {
            None
        };
    }
    if let Some((backend, op)) = name.split_once(':') {
        return if BACKENDS.iter().any(|b| b.eq_ignore_ascii_case(backend)) {
            whole(stem_match(&canonical(op), true, false))
        } else {
            None
        };
    }
    if let Some(c) = thunk(name) {
        return Some(c);
    }
    plain(name)
}

/// One collective's canonical stem: lowercase ASCII letters and digits
/// only, so `all-reduce`, `all_reduce`, `allreduce` and `AllReduce` meet.
struct Stem {
    canon: &'static str,
    kind: CollectiveKind,
    /// Also an ordinary op name: only counts inside a communication
    /// namespace.
    ambiguous: bool,
}

const fn stem(canon: &'static str, kind: CollectiveKind, ambiguous: bool) -> Stem {
    Stem {
        canon,
        kind,
        ambiguous,
    }
}

/// Every collective name, in one place.
const STEMS: &[Stem] = {
    use CollectiveKind::*;
    &[
        stem("allreduce", AllReduce, false),
        stem("psum", AllReduce, false),
        stem("pmax", AllReduce, false),
        stem("pmin", AllReduce, false),
        stem("allgather", AllGather, false),
        stem("reducescatter", ReduceScatter, false),
        stem("psumscatter", ReduceScatter, false),
        stem("alltoall", AllToAll, false),
        stem("raggedalltoall", AllToAll, false),
        stem("collectivepermute", CollectivePermute, false),
        stem("ppermute", CollectivePermute, false),
        stem("collectivebroadcast", Broadcast, false),
        stem("sendrecv", SendRecv, false),
        stem("barrier", Barrier, true),
        stem("monitoredbarrier", Barrier, true),
        stem("broadcast", Broadcast, true),
        stem("reduce", Reduce, true),
        stem("gather", Gather, true),
        stem("scatter", Scatter, true),
        stem("send", SendRecv, true),
        stem("recv", SendRecv, true),
    ]
};

/// What may follow a stem and still name the same collective: PyTorch's
/// variants (`_allgather_base`, `all_gather_into_tensor_coalesced`,
/// `reduce_scatter_tensor`, `all_to_all_single`, `alltoallv`,
/// `_broadcast_oop`, `allreduce_sparse`, `recv_any_source`) and JAX's
/// `*_invariant`. A closed list, so `reduce_sum` or `broadcast_in_dim`
/// never match through `reduce`/`broadcast`.
const TAILS: &[&str] = &[
    "",
    "coalesced",
    "base",
    "intotensor",
    "intotensorcoalesced",
    "tensor",
    "tensorcoalesced",
    "single",
    "v",
    "oop",
    "sparse",
    "anysource",
    "invariant",
];

/// PyTorch process-group backends, as their spans are prefixed.
const BACKENDS: &[&str] = &["gloo", "nccl", "mpi", "ucc", "xccl", "hccl"];

/// NCCL algorithm and protocol words in pre-2.19 kernel names
/// (`ncclAllReduceRingLLKernel_sum_f32`).
const NCCL_ALGOS: &[&str] = &[
    "collnetdirect",
    "collnetchain",
    "collnet",
    "nvlstree",
    "nvls",
    "ring",
    "tree",
    "pat",
    "ll128",
    "ll",
    "simple",
];

fn canonical(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn whole(c: Option<Classified>) -> Option<Classified> {
    c.filter(|c| c.phase == Phase::Whole)
}

/// The stem `canon` names, with a known tail and (when `phases`) an
/// optional `start`/`done` after it.
fn stem_match(canon: &str, allow_ambiguous: bool, phases: bool) -> Option<Classified> {
    let (rest, phase) = match (phases, canon) {
        (true, c) if c.ends_with("start") => (&c[..c.len() - 5], Phase::Start),
        (true, c) if c.ends_with("done") => (&c[..c.len() - 4], Phase::Done),
        (_, c) => (c, Phase::Whole),
    };
    STEMS
        .iter()
        .filter(|s| allow_ambiguous || !s.ambiguous)
        .find(|s| {
            rest.strip_prefix(s.canon)
                .is_some_and(|tail| TAILS.contains(&tail))
        })
        .map(|s| Classified {
            kind: s.kind,
            phase,
        })
}

/// NCCL/RCCL device kernels: `ncclKernel_AllReduce_RING_LL_Sum_float`,
/// `ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)`,
/// and pre-2.19 `ncclAllReduceRingLLKernel_sum_f32`.
fn nccl_kernel(name: &str) -> Option<Classified> {
    let rest = name.strip_prefix("nccl")?;
    let at = rest.find("Kernel")?;
    let (head, after) = (&rest[..at], &rest[at + "Kernel".len()..]);
    let op = if head.is_empty() || head == "Dev" {
        // `ncclDevKernel_<Op>_…`: the op is the first word. `Generic`
        // (RCCL, unspecialised NCCL) names no kind.
        after
            .strip_prefix('_')?
            .split(['_', '('])
            .next()?
            .to_string()
    } else {
        // `nccl<Op><Algo><Proto>Kernel_…`.
        let mut canon = canonical(head);
        strip_algos(&mut canon);
        canon
    };
    let canon = canonical(&op);
    STEMS.iter().find(|s| s.canon == canon).map(|s| Classified {
        kind: s.kind,
        phase: Phase::Whole,
    })
}

fn strip_algos(canon: &mut String) {
    while let Some(algo) = NCCL_ALGOS.iter().find(|a| canon.ends_with(*a)) {
        canon.truncate(canon.len() - algo.len());
    }
}

/// XLA GPU thunks: `NcclAllReduceStartThunk`, `AllGatherStartThunk`,
/// `NcclAllToAllThunk`. Send/recv thunks count only with the `Nccl` prefix:
/// a bare `SendThunk` is a host transfer.
fn thunk(name: &str) -> Option<Classified> {
    let body = name.strip_suffix("Thunk")?;
    let (body, nccl) = match body.strip_prefix("Nccl") {
        Some(b) => (b, true),
        None => (body, false),
    };
    stem_match(&canonical(body), nccl, true)
}

/// Everything else: HLO op names (`all-reduce.3`, `%all-gather-start.1`,
/// `all-reduce-start.clone`), JAX primitives, dotted Python names
/// (`torch.distributed.all_reduce`), NCCL's NVTX ranges (`ncclAllReduce`).
fn plain(name: &str) -> Option<Classified> {
    // HLO instance suffixes: `.3`, `.clone`, `.remat2`.
    let mut s = name;
    while let Some((head, tail)) = s.rsplit_once('.') {
        let suffix = tail.trim_end_matches(|c: char| c.is_ascii_digit());
        if head.is_empty() || !(suffix.is_empty() || suffix == "clone" || suffix == "remat") {
            break;
        }
        s = head;
    }
    // A dotted path: the op is the last segment.
    let s = s.rsplit('.').next().unwrap_or(s);
    if let Some(op) = s
        .strip_prefix("nccl")
        .or_else(|| s.strip_prefix("rccl"))
        .filter(|op| op.starts_with(|c: char| c.is_ascii_uppercase()))
    {
        return whole(stem_match(&canonical(op), true, false));
    }
    stem_match(&canonical(s), false, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use CollectiveKind::*;

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one table of names, one assertion each"
    )]
    fn recognises_collectives_of_every_framework() {
        let cases: &[(&str, CollectiveKind)] = &[
            // XLA HLO ops and numbered instances.
            ("all-reduce", AllReduce),
            ("all-reduce.3", AllReduce),
            ("%all-reduce.3", AllReduce),
            ("all-reduce.3 = f32[8]{0} all-reduce(p)", AllReduce),
            ("all-reduce-start", AllReduce),
            ("all-reduce-start.12", AllReduce),
            ("all-reduce-start.1.clone", AllReduce),
            ("all-gather", AllGather),
            ("all-gather-start.2", AllGather),
            ("reduce-scatter.7", ReduceScatter),
            ("all-to-all.1", AllToAll),
            ("ragged-all-to-all.1", AllToAll),
            ("collective-permute.4", CollectivePermute),
            ("collective-permute-start", CollectivePermute),
            ("collective-broadcast.1", Broadcast),
            // XLA GPU thunks.
            ("AllReduceThunk", AllReduce),
            ("AllReduceStartThunk", AllReduce),
            ("NcclAllReduceStartThunk", AllReduce),
            ("NcclAllGatherStartThunk", AllGather),
            ("NcclReduceScatterStartThunk", ReduceScatter),
            ("NcclAllToAllStartThunk", AllToAll),
            ("NcclCollectivePermuteStartThunk", CollectivePermute),
            ("NcclSendThunk", SendRecv),
            // JAX primitives, bare or as op_name paths.
            ("psum", AllReduce),
            ("pmax", AllReduce),
            ("jit(train_step)/jit(main)/psum", AllReduce),
            ("jit(f)/psum[axes=('i',) axis_index_groups=None]", AllReduce),
            ("all_gather", AllGather),
            ("all_to_all", AllToAll),
            ("ppermute", CollectivePermute),
            ("psum_scatter", ReduceScatter),
            ("reduce_scatter", ReduceScatter),
            ("psum_invariant", AllReduce),
            // PyTorch c10d ops.
            ("c10d::allreduce_", AllReduce),
            ("c10d::allreduce_coalesced_", AllReduce),
            ("c10d::allgather_", AllGather),
            ("c10d::_allgather_base_", AllGather),
            ("c10d::allgather_into_tensor_coalesced_", AllGather),
            ("c10d::reduce_scatter_", ReduceScatter),
            ("c10d::_reduce_scatter_base_", ReduceScatter),
            ("c10d::reduce_scatter_tensor_coalesced_", ReduceScatter),
            ("c10d::barrier", Barrier),
            ("c10d::monitored_barrier_", Barrier),
            ("c10d::broadcast_", Broadcast),
            ("c10d::alltoall_", AllToAll),
            ("c10d::alltoall_base_", AllToAll),
            ("c10d::send", SendRecv),
            ("c10d::recv_", SendRecv),
            ("c10d::recv_any_source_", SendRecv),
            ("c10d::gather_", Gather),
            ("c10d::scatter_", Scatter),
            ("c10d::reduce_", Reduce),
            ("_c10d_functional::all_reduce", AllReduce),
            ("_c10d_functional::all_gather_into_tensor", AllGather),
            ("_c10d_functional::reduce_scatter_tensor", ReduceScatter),
            ("_c10d_functional::all_to_all_single", AllToAll),
            ("c10d_functional::all_reduce", AllReduce),
            ("_c10d_functional_autograd::all_to_all_single", AllToAll),
            // Backend spans.
            ("gloo:all_reduce", AllReduce),
            ("gloo:all_gather", AllGather),
            ("gloo:barrier", Barrier),
            ("gloo:broadcast", Broadcast),
            ("gloo:reduce", Reduce),
            ("gloo:gather", Gather),
            ("gloo:scatter", Scatter),
            ("gloo:all_to_all", AllToAll),
            ("gloo:send", SendRecv),
            ("gloo:recv", SendRecv),
            ("nccl:all_reduce", AllReduce),
            ("nccl:all_reduce_coalesced", AllReduce),
            ("nccl:_all_gather_base", AllGather),
            ("nccl:all_gather_into_tensor_coalesced", AllGather),
            ("nccl:reduce_scatter", ReduceScatter),
            ("nccl:_reduce_scatter_base", ReduceScatter),
            ("nccl:reduce_scatter_tensor_coalesced", ReduceScatter),
            ("nccl:_broadcast_oop", Broadcast),
            ("nccl:_reduce_oop", Reduce),
            ("nccl:all_to_all", AllToAll),
            ("nccl:send 0->1", SendRecv),
            ("nccl:recv 1<-0", SendRecv),
            ("NCCL:ALL_REDUCE", AllReduce),
            ("mpi:all_reduce", AllReduce),
            // NCCL/RCCL kernels, all naming generations, demangled or not.
            ("ncclKernel_AllReduce_RING_LL_Sum_float", AllReduce),
            (
                "void ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                AllReduce,
            ),
            ("ncclDevKernel_AllGather_RING_LL", AllGather),
            (
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                AllReduce,
            ),
            ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", ReduceScatter),
            ("ncclDevKernel_SendRecv", SendRecv),
            ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", SendRecv),
            ("ncclDevKernel_Broadcast_RING_LL", Broadcast),
            ("ncclDevKernel_Reduce_Sum_f32_RING_LL", Reduce),
            ("ncclAllReduceRingLLKernel_sum_f32", AllReduce),
            ("ncclAllReduceTreeLL128Kernel_sum_f16", AllReduce),
            ("ncclReduceScatterRingLLKernel_sum_f32", ReduceScatter),
            ("ncclBroadcastRingLLKernel_copy_i8", Broadcast),
            ("ncclReduceRingLLKernel_sum_f32", Reduce),
            // NCCL's own NVTX ranges, dotted Python names.
            ("ncclAllReduce", AllReduce),
            ("ncclBroadcast", Broadcast),
            ("torch.distributed.all_reduce", AllReduce),
        ];
        for (name, kind) in cases {
            assert_eq!(classify(name), Some(*kind), "{name}");
        }
    }

    #[test]
    fn comms_arg_values_include_the_ambiguous_names() {
        let cases: &[(&str, CollectiveKind)] = &[
            ("allreduce", AllReduce),
            ("allreduce_coalesced", AllReduce),
            ("allgather", AllGather),
            ("all_gather", AllGather),
            ("all_gather_into_tensor", AllGather),
            ("_allgather_base", AllGather),
            ("allgather_into_tensor_coalesced", AllGather),
            ("allgather_coalesced", AllGather),
            ("reduce_scatter", ReduceScatter),
            ("reduce_scatter_tensor", ReduceScatter),
            ("_reduce_scatter_base", ReduceScatter),
            ("reduce_scatter_tensor_coalesced", ReduceScatter),
            ("barrier", Barrier),
            ("broadcast", Broadcast),
            ("_broadcast_oop", Broadcast),
            ("alltoall", AllToAll),
            ("alltoall_base", AllToAll),
            ("all_to_all", AllToAll),
            ("all_to_allv", AllToAll),
            ("send", SendRecv),
            ("recv", SendRecv),
            ("recvAnySource", SendRecv),
            ("gather", Gather),
            ("scatter", Scatter),
            ("reduce", Reduce),
            ("_reduce_oop", Reduce),
        ];
        for (value, kind) in cases {
            assert_eq!(classify_comms_arg(value), Some(*kind), "{value}");
        }
        for value in ["", "coalesced", "wait", "init", "reduce_sum", "gatherer"] {
            assert_eq!(classify_comms_arg(value), None, "{value}");
        }
    }

    #[test]
    fn compute_and_transfer_names_are_not_collectives() {
        let names = [
            "",
            "   ",
            "all",
            "aten::all",
            "aten::allclose",
            "aten::gather",
            "aten::scatter_",
            "aten::scatter_add_",
            "aten::_foreach_add_",
            "torch::distributed::all_reduce",
            "reduce_sum",
            "jit(f)/reduce_sum",
            "fusion.3",
            "loop_fusion.12",
            "dot",
            "dot.1",
            "broadcast_in_dim",
            "broadcast",
            "broadcast.7",
            "reduce",
            "reduce.5",
            "reduce-window.2",
            "reduce-precision.1",
            "gather",
            "gather.2",
            "scatter.1",
            "send.1",
            "recv-done.1",
            "barrier",
            "copy-start.3",
            "async-start",
            "async-done.1",
            "CollectiveDoneThunk",
            "NcclCollectiveDoneThunk",
            "KernelThunk",
            "SendThunk",
            "RecvDoneThunk",
            "ncclDevKernel_Generic",
            "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)",
            "ncclGroupEnd",
            "ncclCommInitRank",
            "_c10d_functional::wait_tensor",
            "c10d::wait",
            "nccl:coalesced",
            "gloo:unknown_op",
            "foo:all_reduce",
            "ProfilerStep#3",
            "cudaLaunchKernel",
            "Memcpy DtoD (Device -> Device)",
            "torch/distributed/distributed_c10d.py(2050): all_reduce",
            "pmaxpool",
            "psummary",
            "all_gather_object",
            "allreducer",
            "ncclKernel",
        ];
        for name in names {
            assert_eq!(classify(name), None, "{name}");
        }
    }

    #[test]
    fn done_halves_are_recognised_but_start_nothing() {
        for name in [
            "all-reduce-done",
            "all-reduce-done.3",
            "all-gather-done.1",
            "collective-permute-done",
            "reduce-scatter-done",
        ] {
            assert_eq!(classify(name), None, "{name}");
            assert_eq!(classify_name(name).map(|c| c.phase), Some(Phase::Done));
        }
        assert_eq!(
            classify_name("all-reduce-start.2"),
            Some(Classified {
                kind: AllReduce,
                phase: Phase::Start
            })
        );
        assert_eq!(
            classify_name("all-gather.4"),
            Some(Classified {
                kind: AllGather,
                phase: Phase::Whole
            })
        );
        assert_eq!(
            classify_name("NcclAllReduceStartThunk").map(|c| c.phase),
            Some(Phase::Start)
        );
    }

    #[test]
    fn backend_spans_have_no_async_halves() {
        // `gloo:all_reduce_start` is no PyTorch name: not a half, not a match.
        assert_eq!(classify_name("gloo:all_reduce_start"), None);
        assert_eq!(classify_name("c10d::allreduce_done"), None);
    }
}
