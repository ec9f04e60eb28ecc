// Package tools holds the project's own measuring tools, apart from the
// runtime packages beside it in internal/: bench (make bench: the
// framework against hand-written Watermill, side by side) and soak (make
// soak: a long run through a RabbitMQ cluster with processes killed at
// random). Nothing a service runs imports them.
package tools
