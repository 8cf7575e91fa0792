// Package testkit is the fence around the test harness: everything under
// shared/testkit exists to test, measure or soak the product, and no
// product package may import it (fence_test.go proves it from the import
// graph). Its packages:
//
//   - pgtest: a database per test, copied from a migrated template.
//   - pgbouncer: a real PgBouncer in transaction mode in front of it.
//   - lambdatest: the real bootstrap binaries under a Runtime API harness.
//   - lambdaemu: the Lambda service emulated around those binaries.
//   - awsfake/snsfake, awsfake/eventbridgefake, awsfake/lambdafake:
//     wire-level AWS fakes, sharing their latency and stall controls
//     (awsfake/faults).
//   - moto: moto_server as a subprocess, for tests against an emulator.
//   - publishtest: the conformance suite every publisher passes.
//   - emftest: reads back Embedded Metric Format records.
//   - soak: the fault-injection soak (and its command, soak/cmd/soak).
//   - statemachine: the SQL state machine's concurrency invariant harness
//     (and its command, statemachine/cmd/statemachine; make statemachine).
//   - workload, deploybench: the deployment benchmark's load and its
//     command.
//
// The throwaway-cluster launcher is not here: `outboxctl demo` uses it, so
// it is product (shared/localpg), and the soak uses it from there.
package testkit
