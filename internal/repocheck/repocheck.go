// Package repocheck holds tests about the repository itself, not about
// code: that a clone stands on its own.
package repocheck
