// Package tools holds the project's own tools, apart from the
// runtime packages beside it in internal/: bench (make bench: the
// framework against hand-written Watermill, side by side) and soak (make
// soak: a long run through a RabbitMQ cluster with processes killed at
// random); and the code generator storegen (go generate ./framework/...:
// the methods of sqlite.Store and postgres.Store, which forward to the one
// SQL implementation under the driver interfaces' doc comments). Nothing a
// service runs imports them.
package tools
