// Package repocheck holds tests about the repository itself, not about
// code: that a clone stands on its own, that the README lists every
// package, and that imports point one way (ARCHITECTURE.md).
package repocheck
