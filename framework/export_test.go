package framework

// Waiting returns how many attempts of u wait for a batch, for tests that
// gather a batch before they let it run.
func Waiting(u *UnitOfWork) int {
	if u.group == nil {
		return 0
	}
	u.group.mu.Lock()
	defer u.group.mu.Unlock()
	return len(u.group.waiting)
}

// SetsSession exposes setsSession to the tests.
var SetsSession = setsSession

// EndsTransaction exposes endsTransaction to the tests.
var EndsTransaction = endsTransaction

// DataException exposes dataException to the tests.
var DataException = dataException
