// Package storetest is the conformance suite of the framework's stores:
// every implementation of driver.Store (sqlite, postgres, memory) runs
// the same cases of its whole method set, mostly through the public path
// of driver.UnitOfWork, so that the backends behave alike: processed
// marks, delivery counts, dead letters and their history, replays,
// subject checkpoints, waits behind a gap, events held and parked behind a
// dead letter, the purge of old marks, the adoption of a renamed
// consumer's history, and the partition leases of a consumer's group
// (driver.Leases), which run in real time, on the database's clock.
//
// # Running the suite
//
// A backend's test gives Exercise a function that returns a Harness for
// each case: a fresh database (nil for an in-memory store) and a way to
// open a store on it.
//
//	func TestStore(t *testing.T) {
//		storetest.Exercise(t, func(t *testing.T) storetest.Harness {
//			db := testenv.SQLite(t)
//			return storetest.Harness{
//				DB: db,
//				NewStore: func(t *testing.T, cfg storetest.Config) driver.Store {
//					ctx := context.Background()
//					err := migrate.Up(ctx, db, migrate.Config{TablePrefix: cfg.TablePrefix})
//					require.NoError(t, err)
//					s, err := sqlite.NewStore(db, sqlite.StoreConfig{TablePrefix: cfg.TablePrefix, Now: cfg.Now})
//					require.NoError(t, err)
//					return s
//				},
//			}
//		})
//	}
//
// # Business writes
//
// With a database, the cases write their effects into a table "effects"
// without any unique constraint, in the attempt's transaction: an effect
// applied twice shows as two rows. Without one, an effect counts when the
// unit of work reports it processed.
package storetest
