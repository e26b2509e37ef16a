package kvevents

import (
	"testing"

	"go.uber.org/goleak"
)

// zmq4 v0.17.0 never stops the sending goroutine of a PUB socket: Close
// does not close its writer. One parked goroutine stays behind per
// Publisher.Run; nothing else may.
var zmq4PubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, zmq4PubWriter) }
