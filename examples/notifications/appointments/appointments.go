// Package appointments is the contract of the events the appointments
// service publishes, shared by producers and consumers.
package appointments

import (
	"time"

	"github.com/effectively-once/effectively/framework"
)

// Source is the CloudEvents source of the appointments service.
const Source = "appointments"

// BookedV1 is the data of version 1 of an appointment booking.
type BookedV1 struct {
	AppointmentID string    `json:"appointmentId" validate:"required"`
	StartsAt      time.Time `json:"startsAt" validate:"required"`
}

// Booked is the event "an appointment was booked", version 1.
var Booked = framework.Define[BookedV1]("appointments.appointment.booked", 1)
