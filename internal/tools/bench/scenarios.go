package bench

// Scenarios returns every scenario of make bench, in the order of the
// report. A scenario in a file of its own is added here, in one line.
func Scenarios() []Scenario {
	return []Scenario{
		amqpScenario(),
		postgresScenario(),
		outsideAMQPScenario(),
		outsidePostgresScenario(),
		orderScenario("amqp", hotKeys),
		orderScenario("amqp", coldKeys),
		orderScenario("postgres", hotKeys),
		orderScenario("postgres", coldKeys),
		scaleOutScenario("amqp"),
		scaleOutScenario("postgres"),
		sqliteScenario(),
		outboxScenario(),
		idleScenario(),
		memoryScenario(),
	}
}
