// Package console serves the operator console of a service in the
// browser: the dead letters counted by consumer and code, one dead letter
// with its history and its message (the body indented when it is JSON,
// the metadata), replay and discard with a reason, bulk replay and
// discard by filter (jobs recorded through driver.BulkJobs, run in the
// process that took the request, until Close), what happened to one
// event, and the consumers with their figures. Its pages are rendered on
// the server with html/template, with a little inline style and script,
// and read and act through the service's driver.Store and
// driver.Inspector.
//
// # Mounting
//
// Package app mounts it on the service's HTTP address when the
// configuration turns it on (see docs/operations.md, Console). Without
// package app:
//
//	c, err := console.New(console.Config{Store: store, Inspector: store, Tokens: tokens})
//	if err != nil {
//		return err
//	}
//	mux.Handle(console.Path, c)
//
// # Access
//
// Every page needs a token (ParseTokens: name:secret:read or
// name:secret:write), presented in an Authorization: Bearer header or
// through the login form, which sets an HttpOnly, SameSite=Strict cookie
// signed with the token's secret. Secrets are compared in constant time.
// Replay and discard need write permission and record the token's name as
// who. A POST is refused when Sec-Fetch-Site (where the browser sends it)
// is not same-origin or Origin is not the console's own; a POST that
// relies on the cookie must also carry the form's CSRF token.
package console
