package fair

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxKeyBytes bounds the bytes of a principal's name that a queue keeps
// while it tracks the principal. A longer name, such as a session key taken
// from a request's body, which may be megabytes, would otherwise be kept as
// long as the principal is remembered, up to MaxPrincipals of them.
const maxKeyBytes = 64

// principalKey returns the key under which a queue tracks the principal
// named name: name itself, or, for a name longer than maxKeyBytes, the hex
// SHA-256 digest of it followed by "#", maxKeyBytes+1 bytes, which no name
// of maxKeyBytes or fewer is and no other longer name gives.
func principalKey(name string) string {
	if len(name) <= maxKeyBytes {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:]) + "#"
}

// principal is the state of one principal: its counter, and its requests
// waiting (a FIFO queue per class) and in flight.
type principal struct {
	key     string  // principalKey of its name
	weight  float64 // the latest Config.Weight
	counter float64 // weighted tokens served, lifted when it starts waiting (VTC)

	waiting  int                 // requests queued, over all classes
	inflight int                 // requests admitted and not done
	head     [numClasses]*Ticket // oldest waiter of each class
	tail     [numClasses]*Ticket // newest waiter of each class
	bidx     int                 // index in Queue.backlog; -1 when nothing waits

	// Links of the idle list, where the principal is when nothing of it
	// waits or is in flight.
	idle               bool
	idlePrev, idleNext *principal
}

// principalLocked returns the principal of key, tracking it if it is not,
// with its weight updated; it is no longer idle.
func (q *Queue) principalLocked(key string, weight float64) *principal {
	p, ok := q.principals[key]
	if !ok {
		p = &principal{key: key, bidx: -1}
		q.principals[key] = p
		q.evictLocked()
	} else if p.idle {
		q.idle.remove(p)
	}
	p.weight = weight
	return p
}

// settleLocked puts p in the idle list if nothing of it waits or is in
// flight.
func (q *Queue) settleLocked(p *principal) {
	if p.idle || p.waiting > 0 || p.inflight > 0 {
		return
	}
	q.idle.pushFront(p)
	q.evictLocked()
}

// evictLocked forgets the principals idle the longest while more than
// MaxPrincipals are tracked.
func (q *Queue) evictLocked() {
	for len(q.principals) > q.maxPrincipals && q.idle.tail != nil {
		old := q.idle.tail
		q.idle.remove(old)
		delete(q.principals, old.key)
	}
}

// idleList is a doubly linked list of idle principals, most recently idle
// first.
type idleList struct {
	head, tail *principal
}

func (l *idleList) pushFront(p *principal) {
	p.idle = true
	p.idlePrev, p.idleNext = nil, l.head
	if l.head != nil {
		l.head.idlePrev = p
	} else {
		l.tail = p
	}
	l.head = p
}

func (l *idleList) remove(p *principal) {
	if p.idlePrev != nil {
		p.idlePrev.idleNext = p.idleNext
	} else {
		l.head = p.idleNext
	}
	if p.idleNext != nil {
		p.idleNext.idlePrev = p.idlePrev
	} else {
		l.tail = p.idlePrev
	}
	p.idle, p.idlePrev, p.idleNext = false, nil, nil
}
