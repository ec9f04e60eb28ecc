// Package docs holds the tests that keep the repository's documentation
// true: the README's and the package docs' code blocks are the code of
// compiled examples and tests, the claims about what the tests prove name
// tests that exist, and the docs stand alone (no file names the design
// notes the repository does not have). It has no code of its own.
package docs
