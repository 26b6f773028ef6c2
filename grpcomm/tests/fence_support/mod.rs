//! Fence test kit on grpcomm's shared test network (`dvm_grpcomm::testnet`, the network the
//! simulator's grpcomm engine runs on too): per-daemon contributions, the obviously-correct
//! result, and the checks every fence test ends with.
#![allow(dead_code)]

use bytes::Bytes;
use dvm_grpcomm::{FenceRequest, FenceSignature, Rank};

#[allow(unused_imports)]
pub use dvm_grpcomm::testnet::{members, Links as Net, XorShift};

/// Deterministic per-daemon, per-fence contribution of varying length (sometimes empty).
pub fn data_of(r: Rank, seq: u64) -> Bytes {
    let len = ((r as u64 * 7 + seq * 3) % 11) as usize;
    Bytes::from((0..len).map(|i| (r as u64 + seq + i as u64) as u8).collect::<Vec<u8>>())
}

/// The obviously-correct result: contributions concatenated in daemon rank order.
pub fn oracle(sig: &FenceSignature, n: u32, seq: u64, collect: bool) -> Bytes {
    if !collect {
        return Bytes::new();
    }
    let mut out = Vec::new();
    for r in members(sig, n) {
        out.extend_from_slice(&data_of(r, seq));
    }
    Bytes::from(out)
}

pub fn request(sig: &FenceSignature, r: Rank, seq: u64, collect: bool) -> FenceRequest {
    FenceRequest { sig: sig.clone(), collect, data: data_of(r, seq), timeout: None, size_hint: None }
}

/// Every participant completed fences 0..k over `sig` exactly once with the oracle's bytes
/// (in sequence order if `in_order`; pipelined allgather fences may finish out of order, each
/// participant finishing on its own); non-participants completed nothing.
pub fn check(net: &Net, sig: &FenceSignature, collects: &[bool], in_order: bool) {
    let n = net.size();
    // Tree messages name a tree neighbour, but for allgather blocks on a detour and results
    // handed to a peer after its lateral link was lost.
    let far = &net.net.stats.far_tree_sends;
    assert!(far.keys().all(|k| ["block", "release"].contains(k)), "tree sends to non-neighbours: {far:?}");
    let who = members(sig, n);
    for r in 0..n {
        let mut mine: Vec<_> = net.done[r as usize].iter().filter(|(id, _)| id.sig == *sig).collect();
        if !in_order {
            mine.sort_by_key(|(id, _)| id.seq);
        }
        if !who.contains(&r) {
            assert!(mine.is_empty(), "non-participant {r} completed {mine:?}");
            continue;
        }
        assert_eq!(mine.len(), collects.len(), "daemon {r} completed {} of {} fences", mine.len(), collects.len());
        for (k, (id, result)) in mine.iter().enumerate() {
            assert_eq!(id.seq, k as u64, "daemon {r}");
            let want = oracle(sig, n, k as u64, collects[k]);
            assert_eq!(result.as_ref(), Ok(&want), "daemon {r} fence {k}");
        }
    }
}
