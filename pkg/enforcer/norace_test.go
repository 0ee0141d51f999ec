//go:build !race

package enforcer

// raceDetector says whether the tests run under -race (simulation).
const raceDetector = false
