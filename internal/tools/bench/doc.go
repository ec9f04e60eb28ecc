// Package bench is the benchmark harness behind make bench: the framework
// against the hand-written Watermill consumer a team would write instead,
// side by side in one run, on real servers. Its command (cmd/bench) prints
// a table and writes docs/benchmarks.md; TestSmoke runs every scenario
// small inside make test, checking effects only, so that it cannot rot.
//
// # Scenarios, runs and results
//
// A Scenario is one comparison: its Runs are measured one after the
// other, and one of them (at most) is the Baseline that the others' ratio
// is taken against. A Run's Measure returns a Result: effects per second,
// latency at half that rate, allocations per message, peak RSS, the top of
// a CPU profile. After Measure the harness checks that the consumer left
// exactly one effect per distinct event fed (Result.Check): a run that
// does not fails, whatever its speed. Two kinds of figure are asserted,
// outside a smoke run: the memory scenario reads the service's resident
// set each tenth of a drain fifty times longer than the others' (Memory)
// and fails when it grew more than MaxRSSGrowth from the first reading to
// the last; and a scenario's Gate bounds one of its runs by the best of
// them in the same report (the outside-call scenarios, whose handler
// waits OutsideWait: the default configuration at least OutsideGate of
// the best run's effects per second; the ordering scenarios: strict_order
// at least OrderGate of the unordered run's), which the report shows
// below the scenario's table and fails when it is not met; a Gate may
// instead take Min of another run (Of), or set a Floor of effects per
// second, and chain another gate (And): the scale-out scenarios
// (scaleout.go) want one process at ScaleOutFloor of its ceiling and four
// at ScaleOutGain times one. The ordering and scale-out scenarios check
// the order of the effects too: a scenario's Measure may fail its run
// with a check of its own.
//
// Every drain also gives the consumer's start-up (Result.StartUp: from
// its process start to its first effect, the backlog waiting for it) and
// its steady-state rate (Result.Steady: after the first SteadyAfter of
// its effects). A run measured in rounds reports the round with the
// median effects per second, and its start-up, steady-state rate and
// latency each as the median of its rounds: the gates judge those
// medians. The gates of issue 47 (gate.go) compare the example service
// with the strongest hand-written consumer and with the machine's limit:
// the hand-written watermill-amqp and watermill-sql consumers are each
// pre-swept (sweep.go: every configuration of a grid of the knobs a
// team would try drained once at SweepScale of the run's messages, the
// fastest then measured in full rounds, the sweep's table in the report);
// the limits are a hand-optimized amqp091-go + pgx consumer
// (amqplimit.go) and Debian's sqlite3 program on a script with the
// service's schema and pragmas (sqlite3limit.go), beside the broker's
// confirming-publisher limit of the outbox scenario. A full run (every
// scenario at the default size and rounds) must also end within
// MaxRunTime; the report gives each scenario's time.
//
// Consumers run as processes of their own, so that their memory and
// allocations compare fairly: the example service (built with go build
// once per run of the harness, started by Env.StartService with the
// framework's variables; it writes a CPU profile with
// EFFECTIVELY_CPU_PROFILE), and children of this program (Env.StartChild),
// which is started again with EnvChild naming a Child of a scenario; the
// program's main (and TestMain) runs ChildMain when IsChild. Both serve
// /readyz and /metrics with the Go runtime's metrics, which Process reads.
// A service runner whose processes field is above one starts that many
// processes of the example service at once (the scale-out scenarios): the
// first is the Process the drain gets, the others its peers, whose exit
// fails the drain and whose allocations count.
//
// Most runs are drains: a System (the consumer, its foreign producer and
// the table of its effects) is measured by Drain, which feeds the backlog
// (Env.Backlog: Options.Events messages, Options.Duplicates of them
// repeats), starts the consumer, times the effects through their
// handled_at column (HandledAtColumn), then, when the System is a Sender,
// paces fresh events at half the drain rate to time their latency.
// Anything else is a Measure of its own, built from the same parts
// (Process, Pace, Percentile, EffectTable).
//
// # Adding a scenario
//
// Write it in a file of its own (the outbox relay in outbox.go, say):
//
//	func outboxScenario() Scenario {
//		return Scenario{
//			Name:  "outbox",
//			Title: "Outbox relay to RabbitMQ",
//			About: "What runs, fed how, against what.",
//			Needs: []Need{NeedPostgres, NeedAMQP},
//			Runs: []Run{
//				{Name: "outbox relay", Measure: measureRelay},
//				{Name: "watermill-amqp publisher, ConfirmDelivery", Baseline: true, Measure: measurePublisher},
//			},
//			Children: []Child{{Name: "publisher", Main: publisherMain}},
//		}
//	}
//
// and add it to Scenarios, in scenarios.go, in one line. A Measure creates
// what it needs through its Env (Env.PostgresSchema, Env.Dir for SQLite
// files, queues of its own) and registers their removal with Env.Cleanup;
// it fills Result.Events with the distinct events it fed and
// Result.Effects and Result.DistinctEffects with what it counted where
// the consumer writes, after the consumer stopped. It honours
// Options.Smoke: at 100 events, no latency phase and no profile, the whole
// smoke test (its scenarios in two lanes) stays within about two minutes.
// A child that starts its work by itself calls ChildEnv.Ready, then
// ChildEnv.WaitBegin, so that the allocations
// the harness reads in between count only the work.
//
// # Running
//
//	make bench                                  # everything, 20,000 messages a run, 3 rounds, within MaxRunTime
//	make bench BENCHFLAGS="-events 2000 -run sqlite"
//	make bench BENCHFLAGS="-smoke -run 'sqlite/default|raw'"  # some runs of a scenario
//	go test ./internal/tools/bench/ -run TestSmoke    # what make test runs
//
// Servers come from EFFECTIVELY_TEST_POSTGRES_URL and, for RabbitMQ,
// EFFECTIVELY_TEST_AMQP_BENCH_URL (a virtual host of the benchmark's own,
// which scripts/services.sh makes: the example service's queue and
// exchange names are fixed, and the example's own tests may use them at
// the same time) or else EFFECTIVELY_TEST_AMQP_URL; make bench and make
// test start them. TestSmoke also takes EFFECTIVELY_TEST_AMQP_SMOKE_URL, a
// second virtual host (scripts/services.sh makes it), to run the RabbitMQ
// scenarios in two lanes at once. Each run creates a schema (or file, or
// queue) of its own and drops it after.
package bench
