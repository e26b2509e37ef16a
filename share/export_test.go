package share

// RaceDetector reports whether the tests run under the race detector, for
// the tests of package share_test.
const RaceDetector = raceEnabled
