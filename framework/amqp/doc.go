// Package amqp is the framework's RabbitMQ transport, built on
// watermill-amqp v3: each event type is a durable fanout exchange named by
// the type; each consumer has one durable queue named after the consumer,
// bound to the exchange of each type it handles; the consumer's
// subscriptions read that queue and dispatch on the CloudEvent type. The
// messages are CloudEvents in structured JSON. docs/transports.md (section
// "RabbitMQ (AMQP)") describes the topology, the traps and how another
// program publishes; docs/contracts.md the wire format.
//
// # Usage
//
//	tr, err := amqp.New(amqp.TransportConfig{URL: "amqp://guest:guest@127.0.0.1:5672/"})
//	if err != nil {
//		return err
//	}
//	defer tr.Close()
//	if err := tr.Connect(ctx); err != nil { // retries while the broker is down
//		return err
//	}
//	sub, _ := tr.Subscribe(driver.SubscribeConfig{
//		Consumer:    "notifications.remind", // the consumer's queue
//		Types:       []string{"appointments.appointment.booked"},
//		Concurrency: 4,
//	})
//	_ = sub.Initialize() // bind before publishing
//	for _, topic := range sub.Topics { // one: it hands out up to Concurrency at once
//		router.AddConsumerHandler("remind@"+topic, topic, sub.Subscriber, handler)
//	}
//	_ = tr.Publisher().Publish("appointments.appointment.booked", msg) // confirms on
//
// Transport (New) is the driver.Transport: one connection, its
// publisher and a subscriber per consumer. A consumer has one subscription
// of its queue, which hands out up to the consumer's concurrency of
// messages at once without waiting for their acks and acks or nacks each
// by itself; Config.Prefetch more are buffered. Replay sends dead letters
// back to one consumer's queue through the default exchange.
//
// # Clusters
//
// TransportConfig.URL may name several nodes of one cluster, separated by
// commas (ParseURLs): the connection goes to the first that answers, and
// when it is lost, to the next node that answers, where the subscriptions
// declare their queues and bindings again and consume on. With
// TransportConfig.QueueType QueueQuorum the consumer queues are quorum
// queues, replicated over the cluster, with x-delivery-limit
// TransportConfig.DeliveryLimit: keep it above every consumer's
// max_deliveries, so that the framework's delivery limit dead-letters a
// message before RabbitMQ drops it.
//
// # Partitions
//
// A consumer subscribed with driver.SubscribeConfig.Partitions N above 1
// is partitioned on RabbitMQ's consistent-hash exchange (the plugin
// rabbitmq_consistent_hash_exchange, which ships with RabbitMQ: enable it
// on every node with rabbitmq-plugins enable
// rabbitmq_consistent_hash_exchange, else Initialize fails with
// ErrNoConsistentHash). The consumer has an exchange "<consumer>.partitions"
// of type x-consistent-hash, hashing the header PartitionHeader, bound to
// the exchange of each of its types, and N durable queues,
// "<consumer>.p00", "<consumer>.p01" and on, the partition in two digits
// (the number of partitions is not in the names), of
// TransportConfig.QueueType, with x-single-active-consumer, each bound to
// it with weight 1. The publishers set PartitionHeader on
// every CloudEvent they publish: its subject, or its id when it has none,
// so that the events of one subject go to one partition, in order. A
// message without it goes to one partition, always the same. The plugin
// picks the partition, the same while the broker runs; RabbitMQ 3.10
// rebuilds its ring when a node restarts, in an order of its own, so that
// afterwards some subjects may go to other partitions than before.
//
// Its Subscriber is a driver.Assigner: it consumes no partition until
// Assign names some, then only those, each on a channel of its own. A
// partition dropped by Assign is cancelled, what the broker sent of it is
// handed out, and Assign returns once the reader settled all of it: its
// next owner sees no redelivery from a classic queue (a quorum queue of
// RabbitMQ 3.10 returns what it had in flight to the cancelled consumer,
// up to its prefetch, which comes again as redeliveries). Replay to a partitioned consumer goes
// through its exchange, to the partition of each message. Initializing
// with fewer partitions than before unbinds the queues of those beyond;
// what they hold stays in them.
//
// # Traps handled
//
//   - A nack would requeue at once and loop hot: the Subscriber pauses
//     first (Config.NackDelay plus the time the subscription has been
//     nacking since its last ack, up to Config.MaxNackDelay: doubling for
//     a message nacked on every delivery).
//   - Non-string headers (x-death, x-delivery-count) would fail
//     watermill-amqp's marshaler before any middleware: Marshaler renders
//     them as text, falls back to the AMQP message-id for the UUID, and
//     maps the redelivered flag to framework.MetadataRedelivered.
//   - A fanout exchange drops what it gets before a queue is bound: bind
//     every consumer's types at start (Subscription.Initialize).
//   - watermill-amqp's constructors fail when the broker is down at boot:
//     Transport.Connect retries with backoff (not a refusal of the
//     credentials: ErrAccessRefused); Transport.Ready reports the
//     connection's state for readiness.
package amqp
