package framework

import "time"

// PollInterval is how often e2e conditions are checked (testutil.EventuallyEvery): slower than the
// envtest tests' 50ms, as each check may list hundreds of nodes on a loaded cluster.
const PollInterval = 500 * time.Millisecond
