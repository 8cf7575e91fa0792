// Package proposal holds candidate optimisations of the product, measured
// by the comparison next to the product as it is. Nothing here is used by
// the product: each is a copy of a product part with one change, so that
// its gain is measured on the same machine in the same run, and the lead
// can decide whether to apply it.
//
//   - ScanRawStore: lease.Store.ClaimBatch scanning the payload as raw bytes
//     instead of through encoding/json (pgx unmarshals into a
//     json.RawMessage, validating every payload the database already
//     validated).
//   - LeanCompleteSQL: outbox.complete_batch without carrying payload and
//     headers of dispatched rows through its CTEs (only dead letters need
//     them), installed under another name in a scratch database only.
//   - ABStore: a dispatch.Store that takes the variants in turn, batch by
//     batch, in one burn-down, so that each variant's claim and completion
//     latencies are measured at the same time on the same data — robust
//     against other work on the machine, which separate runs are not.
//   - RunPipelined: the engine's loop with the next claim and the previous
//     completion overlapped with publishing, for targets whose latency
//     dominates.
package proposal
