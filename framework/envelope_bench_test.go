package framework_test

import (
	"context"
	"testing"

	"github.com/effectively-once/effectively/framework"
)

// typicalBody is what a foreign producer typically publishes: the
// attributes a consumer needs, a time, a subject and a small object as
// data (the benchmark harness's appointments.appointment.booked, whose
// data is bookedV1).
const typicalBody = `{"specversion":"1.0","id":"bench-12345","source":"appointments",` +
	`"type":"appointments.appointment.booked","eventversion":1,"subject":"appt-bench-12345",` +
	`"time":"2026-11-30T09:30:00.123456789Z","data":{"appointmentId":"appt-bench-12345","startsAt":"2026-12-01T09:30:00Z"}}`

// BenchmarkDecode measures decoding one CloudEvent: a typical one, and one
// with every attribute the framework reads set.
func BenchmarkDecode(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"Typical", []byte(typicalBody)},
		{"AllAttributes", fuzzEvent(b)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if _, err := framework.Decode(bc.body, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeAndRoute measures what the chain's decode step does per
// message: decode the CloudEvent, then route it to its handler, decoding
// and validating its data.
func BenchmarkDecodeAndRoute(b *testing.B) {
	c, err := framework.NewConsumer("bench.consumer", framework.Handle(booked, func(context.Context, framework.Event[bookedV1]) error {
		return nil
	}))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(typicalBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		env, err := framework.Decode(body, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Route(env); err != nil {
			b.Fatal(err)
		}
	}
}
