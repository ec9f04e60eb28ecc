package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// CodeMissingTenant is the dead-letter code of an event without a valid
// tenant.
const CodeMissingTenant framework.Code = "missing_tenant"

// validTenant is what a tenant may look like.
var validTenant = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// tenantKey keys the tenant in a context.
type tenantKey struct{}

// TenantFromContext returns the tenant of the event being handled, which
// RequireTenant put in the context; empty outside a delivery.
func TenantFromContext(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// snippet:begin require-tenant

// RequireTenant is Outer middleware: once per delivery, before the
// retries and the transaction, it reads the event's tenant from the
// CloudEvents extension "tenant" and puts it in the message's context,
// where every attempt finds it (TenantFromContext). An event without a
// valid tenant is refused with a permanent error: dead-lettered with code
// missing_tenant, never retried, and acknowledged.
func RequireTenant(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var ext struct {
			Tenant string `json:"tenant"`
		}
		// The body is the structured CloudEvent, which the chain decoded
		// already; extensions are top-level attributes.
		if err := json.Unmarshal(msg.Payload, &ext); err != nil || !validTenant.MatchString(ext.Tenant) {
			d, _ := framework.EnvelopeFromContext(msg.Context())
			return nil, framework.Permanent(CodeMissingTenant,
				fmt.Errorf("event %s: %w", d.Key(), errNoTenant))
		}
		msg.SetContext(context.WithValue(msg.Context(), tenantKey{}, ext.Tenant))
		return next(msg)
	}
}

// snippet:end require-tenant

// errNoTenant says why RequireTenant refused an event, without quoting
// what the event held.
var errNoTenant = errors.New("the extension tenant is missing or not a tenant name")
