// Package fair provides a bounded, token-fair admission queue that sits in
// front of an llmlb.Balancer: it decides which request is sent next when
// demand exceeds capacity.
//
// A [Queue] admits a request at once while its capacity allows (a cap on the
// requests in flight, a cap on the tokens in flight, or both) and otherwise
// makes it wait. Waiting requests are ordered first by priority [Class]
// (Interactive, Standard, Batch), with aging so that lower classes never
// starve, and within a class by the Virtual Token Counter of Sheng et al.,
// "Fairness in Serving Large Language Models" (OSDI 2024): each principal (a
// tenant, or a client; see [Request].Principal) has a counter of the
// weighted tokens it was served, and the next request admitted is one of
// the waiting principal with the least counter. Prompt tokens are charged
// when a request is admitted and output tokens as they stream
// ([Ticket.Charge]), since output length is not known at admission.
//
// A principal that starts waiting, or is admitted at once, has its counter
// lifted, so that an idle principal cannot bank credit and then monopolise
// the capacity: to the least counter of the principals already waiting (or
// of the principal admitted last, if none waits), as in VTC, and, if it has
// nothing in flight, to the queue's virtual time if that is higher. The
// virtual time never decreases. When a request is admitted, and again when
// it is done, with the output it was charged, it rises to the counter of
// the request's principal, as self-clocked fair queueing (Golestani, 1994)
// sets its virtual time to the finish tag of the packet in service; but no
// further than the counter that any principal waiting would have if the
// request had been its own. VTC's level alone would be held down by the
// principals just lifted to it, which are charged nothing until they are
// admitted and leave: principals that each wait once (a client with many
// addresses) would keep it where it is, and a principal above it, served
// once, would wait as long as any of them waits. The virtual time rises
// with every request served, so that principals that each wait once are
// served in turn with the others: with 20 of them always waiting against 3
// steady principals, each steady one gets about 1/23 of the admissions, as
// it would against 20 more steady ones. Its bound keeps every principal it
// lifts at most one request (the last one served, priced at the weight of
// the principal waiting) above the principal waiting that was served
// least, whatever the weights: a principal of weight 0.01 is charged 100
// times its request's tokens, and a virtual time that followed its counter
// would lift every principal after it as far, serving it as if its weight
// were theirs. A principal with requests in flight is not lifted to it,
// since their output, yet to be charged, may be counted in it already.
//
// Past its bounds (waiting requests overall or per principal) the queue
// fails fast, and a waiter whose deadline passes leaves it, with a
// [*retry.OverloadError] (errors.Is [retry.ErrOverloaded]) carrying a
// suggested Retry-After: an HTTP gateway answers 429 with it, as the
// handler of httplb.NewErrorHandler does. A full queue sheds its newest
// waiter of a less urgent class to make room for a more urgent request,
// and else, within the request's class, the newest waiter of the principal
// with the most waiting to make room for a principal with at least two
// fewer, so that no principal can keep the others out by filling it.
//
// The order in which waiters are admitted, for a waiter w of principal p:
//
//  1. the lowest effective rank of w's class: its rank (Interactive 0,
//     Standard 1, Batch 2), less one for every full [Config.AgingInterval]
//     the class has waited, and never below 0;
//  2. then, at equal effective rank, the class aged the most below its own
//     rank;
//  3. then the least counter of p (weighted service received);
//  4. then the earliest arrival.
//
// A class waits from the arrival of its oldest waiter or from the last
// admission of one of its requests, whichever is later. So a class of rank
// k that has waited k aging intervals competes as Interactive, however
// much more urgent traffic keeps arriving, and goes first, however much
// its principals were served before; and since its next admission restarts
// its wait, aging lends a class one admission each time it has aged to a
// waiting more urgent class's rank (one per interval above the next rank,
// one per k intervals above Interactive), not that class's place: under
// sustained overload the more urgent classes keep their order and a less
// urgent backlog is not starved, it advances at that pace until capacity
// frees up (or it is shed, or its deadlines pass).
// A class ages as a whole: aging lifts a less urgent class above a more
// urgent one, never one waiter above another of its own class, so that a
// principal's backlog, however old, does not pass a principal served less
// (VTC holds within every class).
// Admission is strictly in that order: when the first waiter does not fit
// the token cap, no later one is admitted past it, and it keeps its place
// until it fits: however aging or the counters change the order meanwhile,
// no waiter of its class or of a less urgent one is admitted before it (one
// of a more urgent class still is), so that the admissions aging lends a
// less urgent class cannot keep the tokens in flight from ever draining.
//
// A Queue is safe for concurrent use. It starts no goroutines: a waiter
// blocks in its own [Queue.Admit] call and is woken by the release that
// makes room for it ([Ticket.Done]), by its context, or by being shed.
// Callers that cannot block, such as an event loop or a simulator, use
// [Queue.Enter] instead, which never waits and reports a queued ticket's
// admission to a function.
//
// This package's plain data types (Config, Request, Stats) hold no lock: any
// number of goroutines may read a value of one at once, but none may write
// it meanwhile.
package fair
