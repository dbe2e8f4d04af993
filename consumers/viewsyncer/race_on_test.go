//go:build race

package viewsyncer

// raceOn is set under the race detector, which slows the tests' seeding
// and queries several times over: timing tests scale down.
const raceOn = true
