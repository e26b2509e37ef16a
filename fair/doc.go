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
// tenant, or a session) has a counter of the weighted tokens it was served,
// and the next request admitted is one of the waiting principal with the
// least counter. Prompt tokens are charged when a request is admitted and
// output tokens as they stream ([Ticket.Charge]), since output length is not
// known at admission. A principal that starts waiting has its counter lifted
// to the least counter of the principals already waiting, so that an idle
// principal cannot bank credit and then monopolise the capacity.
//
// Past its bounds (waiting requests overall or per principal) the queue
// fails fast, and a waiter whose deadline passes leaves it, with a
// [*retry.OverloadError] (errors.Is [retry.ErrOverloaded]) carrying a
// suggested Retry-After: an HTTP gateway answers 429 with it, as
// httplb.ErrorHandler does. A full queue sheds its newest waiter of a less
// urgent class to make room for a more urgent request.
//
// The order in which waiters are admitted, for a waiter w of principal p:
//
//  1. the lowest effective rank: the rank of w's class (Interactive 0,
//     Standard 1, Batch 2), less one for every full [Config.AgingInterval]
//     w has waited, and never below 0;
//  2. then the least counter of p (weighted service received);
//  3. then the earliest arrival.
//
// So a waiter of rank k competes as an Interactive request after k aging
// intervals, however much more urgent traffic keeps arriving, and from then
// on is admitted before every later arrival of a principal with a larger
// counter. Admission is strictly in that order: when the first waiter does
// not fit the token cap, no later one is admitted past it.
//
// A Queue is safe for concurrent use. It starts no goroutines: a waiter
// blocks in its own [Queue.Admit] call and is woken by the release that
// makes room for it ([Ticket.Done]), by its context, or by being shed.
package fair
