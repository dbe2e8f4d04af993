//go:build !race

package viewsyncer

const raceOn = false
